"""The rollout service's HTTP API (v1). Thin routes over the job store and the pipeline."""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import FastAPI, HTTPException, Query, Response
from fastapi.exceptions import RequestValidationError
from prometheus_client import generate_latest

import raas
from raas.agent.chat import ChatRenderer
from raas.contracts import (
    EnvInfo,
    EnvList,
    LLMServer,
    LLMServerList,
    PolicyAnnouncement,
    ResultsPage,
    RolloutRequest,
    RolloutStatus,
    ServiceHealth,
    Stage,
    SubmitResponse,
)
from raas.envs import registry
from raas.envs.base import TaskError
from raas.http import validation_handler
from raas.service import metrics
from raas.service.jobs import JobStore
from raas.service.pipeline import Pipeline
from raas.service.llm import Router


def create_app(
    tokenizer,
    llm_urls: list[str],
    *,
    max_model_len: int = 8192,
    state_dir: str | None = None,
    workers: dict[Stage, int] | None = None,
) -> FastAPI:
    store = JobStore(state_dir)
    router = Router(llm_urls)
    pipeline = Pipeline(
        store,
        router,
        ChatRenderer(tokenizer),
        max_model_len,
        workers or {Stage.init: 8, Stage.run: 64, Stage.eval: 8},
    )
    state = {"policy_version": 0}

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await pipeline.start()
        for job in store.recovered:  # accepted before a restart and not finished: run again
            pipeline.submit(job)
        yield
        await pipeline.stop()
        await router.aclose()
        store.close()

    app = FastAPI(title="raas rollout service", version=raas.__version__, lifespan=lifespan)
    app.add_exception_handler(RequestValidationError, validation_handler)
    app.state.store, app.state.pipeline, app.state.router = store, pipeline, router

    @app.post("/v1/rollouts", status_code=202, response_model=SubmitResponse)
    async def submit(req: RolloutRequest) -> SubmitResponse:
        env = registry.get(req.task.env)
        if env is None:
            known = ", ".join(sorted(registry.available()))
            raise HTTPException(404, f"task.env: unknown environment {req.task.env!r}; available: {known}")
        try:
            env.validate(req.task.instance())
        except TaskError as e:
            raise HTTPException(422, str(e)) from None
        group_id, jobs, dup = store.submit(req)
        if not dup:
            metrics.SUBMITTED.inc(len(jobs))
            for job in jobs:
                pipeline.submit(job)
        return SubmitResponse(group_id=group_id, ids=[j.id for j in jobs], duplicate=dup)

    @app.get("/v1/rollouts/{job_id}", response_model=RolloutStatus)
    async def get_rollout(job_id: str) -> RolloutStatus:
        job = store.jobs.get(job_id)
        if job is None:
            raise HTTPException(404, f"id: no rollout {job_id!r}")
        return job.status()

    @app.delete("/v1/rollouts/{job_id}", response_model=RolloutStatus)
    async def cancel_rollout(job_id: str) -> RolloutStatus:
        job = store.jobs.get(job_id)
        if job is None:
            raise HTTPException(404, f"id: no rollout {job_id!r}")
        await pipeline.cancel(job)
        return job.status()

    @app.get("/v1/results", response_model=ResultsPage)
    async def results(
        after: int = Query(0, ge=0, description="cursor from the previous page"),
        limit: int = Query(256, ge=1, le=4096),
        wait_s: float = Query(0.0, ge=0.0, le=300.0, description="long-poll up to this long for a result"),
    ) -> ResultsPage:
        jobs = await store.wait_results(after, limit, wait_s)
        return ResultsPage(results=[j.status() for j in jobs], cursor=after + len(jobs))

    @app.get("/v1/envs", response_model=EnvList)
    async def envs() -> EnvList:
        return EnvList(
            envs=[EnvInfo(name=n, description=c.description, fields=c.fields) for n, c in sorted(registry.available().items())]
        )

    @app.get("/v1/llm/servers", response_model=LLMServerList)
    async def list_servers() -> LLMServerList:
        return LLMServerList(servers=[LLMServer(url=u) for u in router.urls])

    @app.post("/v1/llm/servers", response_model=LLMServerList)
    async def add_server(server: LLMServer) -> LLMServerList:
        router.add(server.url)
        return await list_servers()

    @app.delete("/v1/llm/servers", response_model=LLMServerList)
    async def remove_server(url: str = Query(..., description="the server to remove")) -> LLMServerList:
        if not await router.remove(url):
            raise HTTPException(404, f"url: {url!r} is not registered")
        return await list_servers()

    @app.post("/v1/policy", response_model=PolicyAnnouncement)
    async def announce_policy(p: PolicyAnnouncement) -> PolicyAnnouncement:
        state["policy_version"] = max(state["policy_version"], p.version)
        return PolicyAnnouncement(version=state["policy_version"])

    @app.get("/health", response_model=ServiceHealth)
    async def health() -> ServiceHealth:
        counts = store.counts()
        return ServiceHealth(
            status="ok" if router.urls else "degraded",
            version=raas.__version__,
            policy_version=state["policy_version"],
            llm_servers=router.urls,
            queued=counts["queued"],
            running={s.value: pipeline.busy[s] for s in Stage},
            done=counts["done"],
        )

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.REGISTRY), media_type="text/plain; version=0.0.4")

    return app
