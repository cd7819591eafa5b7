"""Prometheus metrics of the rollout service (served at ``GET /metrics``)."""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry()
SUBMITTED = Counter("raas_jobs_submitted", "Rollout jobs accepted", registry=REGISTRY)
FINISHED = Counter("raas_jobs_finished", "Rollout jobs finished, by status", ["status"], registry=REGISTRY)
QUEUED = Gauge("raas_stage_queued", "Jobs waiting for a stage worker", ["stage"], registry=REGISTRY)
STAGE_SECONDS = Histogram(
    "raas_stage_seconds",
    "Seconds a job spent in a stage",
    ["stage"],
    buckets=(0.01, 0.05, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
    registry=REGISTRY,
)
