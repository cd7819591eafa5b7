"""The staged pipeline: INIT -> RUN -> EVAL, each stage with its own worker pool.

Every job passes the three stages in order; each stage has a priority queue and a fixed number of
workers, so a slow test suite in EVAL never holds a generation slot in RUN. A job's timeout covers
the time from the start of its INIT to the end of its EVAL (queueing before INIT does not count).

Invariant: every job that enters ``submit`` reaches ``JobStore.finish`` exactly once, and
``Env.close`` runs for every episode that INIT produced, whatever happened after.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from raas.agent.chat import ChatRenderer
from raas.agent.loop import EpisodeResult
from raas.contracts import JobState, Stage, Status, Timing, Trajectory, TrajectoryError
from raas.envs import registry
from raas.envs.base import Env, Episode, RunContext
from raas.service import metrics
from raas.service.jobs import Job, JobStore
from raas.service.llm import Router

log = logging.getLogger(__name__)


@dataclass
class _Work:
    """A job's in-pipeline state, handed from stage to stage."""

    job: Job
    env: Env
    timing: Timing = field(default_factory=Timing)
    episode: Episode | None = None
    result: EpisodeResult | None = None
    reward: float = 0.0
    eval_metrics: dict[str, Any] = field(default_factory=dict)
    entered: float = field(default_factory=time.monotonic)  # when it entered its current queue

    def __lt__(self, other: _Work) -> bool:  # PriorityQueue ordering: higher priority, then FIFO
        return (-self.job.request.priority, self.job.seq) < (-other.job.request.priority, other.job.seq)


class _Cancelled(Exception):
    pass


class Pipeline:
    def __init__(
        self,
        store: JobStore,
        router: Router,
        renderer: ChatRenderer,
        max_model_len: int,
        workers: dict[Stage, int],
    ):
        self.store = store
        self.router = router
        self.renderer = renderer
        self.max_model_len = max_model_len
        self.workers = workers
        self.queues: dict[Stage, asyncio.PriorityQueue] = {s: asyncio.PriorityQueue() for s in Stage}
        self.busy: dict[Stage, int] = {s: 0 for s in Stage}
        self._tasks: list[asyncio.Task] = []
        self._live: dict[str, _Work] = {}  # job id -> work, while in the pipeline
        self._stopping = False

    async def start(self) -> None:
        for stage, n in self.workers.items():
            for i in range(n):
                self._tasks.append(asyncio.create_task(self._worker(stage), name=f"{stage.value}-{i}"))

    async def stop(self) -> None:
        """Stop the workers. With a durable store, unfinished jobs stay unfinished in the journal
        and run again after a restart; without one they are reported as cancelled."""
        self._stopping = True
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for w in list(self._live.values()):
            if self.store.durable:
                self._live.pop(w.job.id, None)
                if w.episode is not None:
                    await _close_quietly(w)
            else:
                await self._finish(w, Status.cancelled, ("service", "Shutdown", "the service stopped before this job finished"))

    # ------------------------------------------------------------------ entry points
    def submit(self, job: Job) -> None:
        env = registry.get(job.request.task.env)
        if env is None:  # validated at the API; only a journal from another install can hit this
            asyncio.get_running_loop().create_task(
                self._finish(_Work(job, _NullEnv()), Status.failed, ("init", "UnknownEnv", job.request.task.env))
            )
            return
        work = _Work(job, env)
        self._live[job.id] = work
        self.queues[Stage.init].put_nowait(work)
        metrics.QUEUED.labels(Stage.init.value).inc()

    async def cancel(self, job: Job, reason: str = "cancelled by client") -> bool:
        """Cancel a job that has not finished. Returns False if it already had."""
        work = self._live.get(job.id)
        if work is None or job.state == JobState.done:
            return False
        job.cancel_requested = True
        if job.task is not None:
            job.task.cancel()  # the worker sees CancelledError and finishes the job
        else:
            # Waiting in a queue: finish it now; the worker skips it when it comes up.
            await self._finish(work, Status.cancelled, ("queue", "Cancelled", reason))
        return True

    # ------------------------------------------------------------------ workers
    async def _worker(self, stage: Stage) -> None:
        q = self.queues[stage]
        while True:
            work: _Work = await q.get()
            metrics.QUEUED.labels(stage.value).dec()
            job = work.job
            if job.state == JobState.done:  # cancelled while queued
                continue
            work.timing.queued_s += time.monotonic() - work.entered
            if stage == Stage.init:
                job.started_at = time.monotonic()
            job.state = JobState(stage.value)
            self.busy[stage] += 1
            t0 = time.monotonic()
            job.task = asyncio.current_task()
            try:
                await self._run_stage(stage, work)
            except asyncio.CancelledError:
                job.task = None
                self.busy[stage] -= 1
                if job.cancel_requested and not self._stopping:
                    _uncancel()
                    await self._finish(work, Status.cancelled, (stage.value, "Cancelled", "cancelled by client"))
                    continue
                raise  # the service is stopping
            except TimeoutError:
                job.task = None
                self.busy[stage] -= 1
                limit = job.request.timeout_s
                await self._finish(work, Status.timeout, (stage.value, "Timeout", f"timeout_s={limit} elapsed in {stage.value}"))
                continue
            except Exception as e:
                job.task = None
                self.busy[stage] -= 1
                log.warning("job %s failed in %s: %s", job.id, stage.value, e, exc_info=True)
                await self._finish(work, Status.failed, (stage.value, type(e).__name__, str(e)[:2000]))
                continue
            job.task = None
            self.busy[stage] -= 1
            dt = time.monotonic() - t0
            setattr(work.timing, f"{stage.value}_s", dt)
            metrics.STAGE_SECONDS.labels(stage.value).observe(dt)
            if stage == Stage.eval:
                await self._finish(work, work.result.status, None)
            else:
                nxt = Stage.run if stage == Stage.init else Stage.eval
                work.entered = time.monotonic()
                self.queues[nxt].put_nowait(work)
                metrics.QUEUED.labels(nxt.value).inc()

    async def _run_stage(self, stage: Stage, work: _Work) -> None:
        req = work.job.request
        remaining = None
        if req.timeout_s is not None:
            remaining = req.timeout_s - (time.monotonic() - work.job.started_at)
            if remaining <= 0:
                raise TimeoutError
        async with asyncio.timeout(remaining):
            if stage == Stage.init:
                work.episode = await work.env.init(req.task.instance())
            elif stage == Stage.run:
                ctx = RunContext(
                    client=self.router.session(work.job.id),
                    renderer=self.renderer,
                    sampling=req.sampling,
                    agent=req.agent,
                    max_model_len=self.max_model_len,
                )
                try:
                    work.result = await work.env.run(work.episode, ctx)
                finally:
                    self.router.forget(work.job.id)
            else:
                reward, m = await work.env.eval(work.episode, work.result)
                work.reward, work.eval_metrics = float(reward), dict(m)

    async def _finish(self, work: _Work, status: Status, error: tuple[str, str, str] | None) -> None:
        job = work.job
        self._live.pop(job.id, None)
        if work.episode is not None:
            await _close_quietly(work)
        traj = build_trajectory(work, status, error)
        metrics.FINISHED.labels(status.value).inc()
        await self.store.finish(job, traj)


def build_trajectory(work: _Work, status: Status, error: tuple[str, str, str] | None) -> Trajectory:
    job, res = work.job, work.result
    fields: dict[str, Any] = {}
    if res is not None:
        fields = dict(
            tokens=res.tokens, loss_mask=res.loss_mask, logprobs=res.logprobs, versions=res.versions, turns=res.turns
        )
    metrics_: dict[str, Any] = dict(job.request.metadata)
    if res is not None:
        metrics_.update(
            work.eval_metrics,
            turns=res.num_turns,
            tool_calls=res.tool_calls,
            tool_errors=res.tool_errors,
            stop_reason=res.stop_reason,
            sample_index=job.index,
        )
    return Trajectory(
        id=job.id,
        group_id=job.group_id,
        task_id=work.episode.task_id if work.episode else f"{job.request.task.env}:?",
        env=job.request.task.env,
        reward=work.reward if status in (Status.completed, Status.truncated) else 0.0,
        metrics=metrics_,
        status=status,
        timing=work.timing,
        error=TrajectoryError(stage=error[0], type=error[1], message=error[2]) if error else None,
        **fields,
    )


async def _close_quietly(work: _Work) -> None:
    try:
        await work.env.close(work.episode)
    except Exception:
        log.exception("env %s failed to clean up job %s", work.env.name, work.job.id)


def _uncancel() -> None:
    t = asyncio.current_task()
    if t is not None:
        while t.uncancel():
            pass


class _NullEnv(Env):
    name = "?"

    async def init(self, instance):  # pragma: no cover - never called
        raise NotImplementedError

    async def eval(self, episode, result):  # pragma: no cover
        raise NotImplementedError
