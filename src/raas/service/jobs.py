"""Jobs and the job store of the rollout service.

Invariants:
* a job accepted with 202 is in the journal before the response is sent, and every accepted job
  reaches exactly one terminal result (completed, truncated, failed, timeout or cancelled);
* results are appended in completion order and never reordered, so ``GET /v1/results?after=N``
  is a stable cursor;
* with a state directory, the journal (append-only JSONL) survives restarts: finished results are
  reloaded, unfinished jobs are queued again from scratch.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from raas.contracts import JobState, RolloutRequest, RolloutStatus, Trajectory


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


@dataclass
class Job:
    id: str
    group_id: str
    index: int  # sample index within the group
    request: RolloutRequest
    seq: int  # submission order, breaks priority ties FIFO
    state: JobState = JobState.queued
    trajectory: Trajectory | None = None
    submitted_at: float = field(default_factory=time.monotonic)
    started_at: float | None = None
    cancel_requested: bool = False
    task: asyncio.Task | None = None  # the stage coroutine currently running this job

    @property
    def client_id(self) -> str | None:
        return self.request.client_id

    def status(self) -> RolloutStatus:
        return RolloutStatus(
            id=self.id, group_id=self.group_id, client_id=self.client_id, status=self.state, trajectory=self.trajectory
        )


class JobStore:
    def __init__(self, state_dir: str | Path | None = None):
        self.jobs: dict[str, Job] = {}
        self.groups: dict[str, list[str]] = {}
        self.by_client_id: dict[str, str] = {}  # client_id -> group_id
        self.results: list[str] = []  # job ids in completion order
        self._seq = 0
        self._changed = asyncio.Condition()
        self._journal = None
        self.recovered: list[Job] = []  # unfinished jobs found in the journal at start
        if state_dir is not None:
            d = Path(state_dir)
            d.mkdir(parents=True, exist_ok=True)
            path = d / "journal.jsonl"
            if path.exists():
                self._replay(path)
            self._journal = open(path, "a", encoding="utf-8")

    @property
    def durable(self) -> bool:
        return self._journal is not None

    # ------------------------------------------------------------------ journal
    def _write(self, record: dict) -> None:
        if self._journal is None:
            return
        self._journal.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._journal.flush()
        os.fsync(self._journal.fileno())

    def _replay(self, path: Path) -> None:
        finished: dict[str, Trajectory] = {}
        order: list[str] = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line from a crash: the job it described is re-run
            if rec["type"] == "submit":
                req = RolloutRequest.model_validate(rec["request"])
                self._add_group(rec["group_id"], rec["ids"], req)
            elif rec["type"] == "result" and rec["id"] in self.jobs:
                finished[rec["id"]] = Trajectory.model_validate(rec["trajectory"])
                order.append(rec["id"])
        for jid in order:
            job = self.jobs[jid]
            job.trajectory, job.state = finished[jid], JobState.done
            self.results.append(jid)
        self.recovered = [j for j in self.jobs.values() if j.state != JobState.done]

    # ------------------------------------------------------------------ mutations
    def _add_group(self, group_id: str, ids: list[str], req: RolloutRequest) -> list[Job]:
        jobs = []
        for i, jid in enumerate(ids):
            self._seq += 1
            job = Job(id=jid, group_id=group_id, index=i, request=req, seq=self._seq)
            self.jobs[jid] = job
            jobs.append(job)
        self.groups[group_id] = ids
        if req.client_id:
            self.by_client_id[req.client_id] = group_id
        return jobs

    def submit(self, req: RolloutRequest) -> tuple[str, list[Job], bool]:
        """Accept a group; returns (group_id, jobs, duplicate). Idempotent on ``client_id``."""
        if req.client_id and req.client_id in self.by_client_id:
            gid = self.by_client_id[req.client_id]
            return gid, [self.jobs[j] for j in self.groups[gid]], True
        gid = new_id("g")
        ids = [new_id("r") for _ in range(req.n)]
        self._write({"type": "submit", "group_id": gid, "ids": ids, "request": req.model_dump(mode="json")})
        return gid, self._add_group(gid, ids, req), False

    async def finish(self, job: Job, traj: Trajectory) -> None:
        if job.state == JobState.done:
            return
        self._write({"type": "result", "id": job.id, "trajectory": traj.model_dump(mode="json")})
        job.trajectory, job.state = traj, JobState.done
        self.results.append(job.id)
        async with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------------ queries
    async def wait_results(self, after: int, limit: int, wait_s: float) -> list[Job]:
        """Results after cursor ``after``; waits up to ``wait_s`` for at least one (long poll)."""
        if len(self.results) <= after and wait_s > 0:
            async with self._changed:
                try:
                    await asyncio.wait_for(self._changed.wait_for(lambda: len(self.results) > after), wait_s)
                except TimeoutError:
                    pass
        return [self.jobs[j] for j in self.results[after : after + limit]]

    def counts(self) -> dict[str, int]:
        c = {s.value: 0 for s in JobState}
        for j in self.jobs.values():
            c[j.state.value] += 1
        return c

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
