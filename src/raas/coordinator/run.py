"""The coordinator: keeps rollouts in flight, forms batches, trains, publishes, evaluates.

Reads like the algorithm:  submit -> collect groups -> staleness gate -> train -> publish.

Invariants (see ``staleness.py`` for the gate's):
* every group submitted for training is either trained on once, or dropped as too stale and
  replaced by a fresh group, never silently lost;
* weights are loaded by every engine before the service is told the new version, so a token
  tagged version v was sampled by exactly the weights of version v.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import time
import uuid
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from raas import models
from raas.contracts import AgentConfig, RolloutRequest, SamplingParams, TaskSpec, Trajectory, WeightUpdateRequest
from raas.coordinator.client import ServiceClient, publish_weights
from raas.coordinator.config import RunConfig, dump
from raas.coordinator.staleness import GroupBuffer, StalenessGate

log = logging.getLogger(__name__)
console = Console(stderr=True)
_MAX_UNCLAIMED_GROUPS = 4096


def run_training(cfg: RunConfig) -> int:
    from raas.launch import EngineProcess, ServiceProcess
    from raas.trainer.trainer import Trainer

    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(dump(cfg))
    t0 = time.monotonic()
    model_dir = models.prepare(cfg.model.path)
    with contextlib.ExitStack() as stack:
        service_url, engine_urls = cfg.service.url, list(cfg.service.engine_urls)
        if not service_url:
            # The service we start serves this launch only: an earlier launch's jobs belong to
            # groups this coordinator does not know (resuming restarts rollouts from the checkpoint).
            shutil.rmtree(run_dir / "service", ignore_errors=True)
            console.print(f"[bold]raas[/]: starting the embedded engine and the rollout service ({model_dir.name})")
            eng = EngineProcess(model_dir, threads=cfg.service.engine_threads, log_path=run_dir / "engine.log")
            stack.enter_context(eng)
            svc = ServiceProcess(
                model_dir, [eng.url], state_dir=run_dir / "service", log_path=run_dir / "service.log",
                run_workers=cfg.service.run_workers,
            )
            stack.enter_context(svc)
            service_url, engine_urls = svc.url, [eng.url]
        trainer = Trainer(model_dir, cfg.trainer, cfg.model.device)
        coord = Coordinator(cfg, trainer, service_url, engine_urls, run_dir, t0)
        return asyncio.run(coord.run())


class Coordinator:
    def __init__(self, cfg: RunConfig, trainer, service_url: str, engine_urls: list[str], run_dir: Path, t0: float):
        self.cfg, self.trainer, self.run_dir, self.t0 = cfg, trainer, run_dir, t0
        self.client = ServiceClient(service_url)
        self.engine_urls = engine_urls
        self.gate = StalenessGate(cfg.run.max_staleness)
        self.buffer = GroupBuffer()
        self.ready: asyncio.Queue[list[Trajectory]] = asyncio.Queue()
        self.eval_buffer = GroupBuffer()
        self.evals: dict[str, asyncio.Future] = {}  # eval group id -> its finished samples
        # Results whose group is not registered (yet): a retried submit's earlier results, or other
        # clients' jobs on a shared service. Bounded; the oldest groups are forgotten first.
        self.unclaimed: dict[str, list[Trajectory]] = {}
        self.nonce = uuid.uuid4().hex[:8]  # client ids of this run never collide with another run's
        self.next_seed = cfg.task.train_seed_start
        self.step = 0
        self.metrics_path = run_dir / "metrics.jsonl"
        self.eval_history: list[dict] = []

    # ------------------------------------------------------------------ main loop
    async def run(self) -> int:
        cfg = self.cfg
        if not self.engine_urls:
            self.engine_urls = await self.client.llm_servers()
        await self._maybe_resume()
        pump = asyncio.create_task(self._pump_results())
        try:
            if self.step == 0:
                await self.evaluate()
            next_submit = self.step
            with _progress() as bar:
                task = bar.add_task("training", total=cfg.run.steps, completed=self.step, info="")
                while self.step < cfg.run.steps:
                    while next_submit < cfg.run.steps and self.gate.may_submit(next_submit, self.trainer.version):
                        for _ in range(cfg.rollout.groups_per_step):
                            await self.submit_group(next_submit)
                        next_submit += 1
                    rec = await self.train_step()
                    bar.update(task, advance=1, info=f"reward {rec['reward_mean']:.2f} | stale {rec['staleness_max']}")
                    if cfg.run.eval_every and self.step % cfg.run.eval_every == 0 and self.step < cfg.run.steps:
                        await self.evaluate()
                    if cfg.run.checkpoint_every and self.step % cfg.run.checkpoint_every == 0:
                        await asyncio.to_thread(self.checkpoint)
            await self.evaluate()
            await asyncio.to_thread(self.checkpoint)
        finally:
            pump.cancel()
            await self.client.aclose()
        return self.summary()

    async def train_step(self) -> dict:
        cfg, v = self.cfg, self.trainer.version
        t_wait = time.monotonic()
        batch: list[list[Trajectory]] = []
        dropped = 0
        while len(batch) < cfg.rollout.groups_per_step:
            group = await self.ready.get()
            if self.gate.admits(group, v):
                batch.append(group)
            else:  # too stale: drop it and put a fresh task in its place
                dropped += 1
                await self.submit_group(self.step)
        wait_s = time.monotonic() - t_wait
        flat = [t for g in batch for t in g]
        stats = await asyncio.to_thread(self.trainer.step, flat)
        t_pub = time.monotonic()
        await self.publish()
        self.step += 1
        rewards = [t.reward for t in flat]
        rec = {
            "step": self.step,
            "version": self.trainer.version,
            "reward_mean": sum(rewards) / len(rewards),
            "success_rate": sum(r >= 1.0 for r in rewards) / len(rewards),
            "staleness_mean": sum(self.gate.staleness(g, v) for g in batch) / len(batch),
            "staleness_max": max(self.gate.staleness(g, v) for g in batch),
            "dropped_stale_groups": dropped,
            "samples": len(flat),
            "sampled_tokens": sum(t.num_sampled for t in flat),
            "status": _count(t.status.value for t in flat),
            "rollout_s_mean": sum(t.timing.run_s for t in flat) / len(flat),
            "wait_s": wait_s,
            "publish_s": time.monotonic() - t_pub,
            "elapsed_s": time.monotonic() - self.t0,
            **stats,
        }
        self._log(rec)
        return rec

    # ------------------------------------------------------------------ rollouts
    async def submit_group(self, step: int, *, eval_seed: int | None = None) -> str:
        cfg = self.cfg
        ro = cfg.rollout
        extra = {k: v for k, v in (cfg.task.model_extra or {}).items()}
        if eval_seed is None:
            seed, self.next_seed = self.next_seed, self.next_seed + 1
            n, temp, cid = ro.group_size, ro.temperature, f"{cfg.run.name}-{self.nonce}-train-{seed}"
        else:
            seed, n, temp = eval_seed, ro.eval_samples, ro.eval_temperature
            cid = f"{cfg.run.name}-{self.nonce}-eval-v{self.trainer.version}-{seed}"
        req = RolloutRequest(
            task=TaskSpec(env=cfg.task.env, seed=seed, **extra),
            n=n,
            sampling=SamplingParams(temperature=temp, top_p=ro.top_p, max_tokens=ro.max_tokens),
            agent=AgentConfig(max_turns=ro.max_turns, max_total_tokens=ro.max_total_tokens),
            timeout_s=ro.timeout_s,
            client_id=cid,
            priority=1 if eval_seed is not None else 0,
            metadata={"step": step, "eval": eval_seed is not None},
        )
        resp = await self.client.submit(req)
        if eval_seed is None:
            self.buffer.expect(resp.group_id, n)
        else:
            self.eval_buffer.expect(resp.group_id, n)
            self.evals[resp.group_id] = asyncio.get_running_loop().create_future()
        # A retried submit can return jobs that finished before we registered their group.
        for t in self.unclaimed.pop(resp.group_id, []):
            self._route(t)
        return resp.group_id

    async def _pump_results(self) -> None:
        async for item in self.client.results(wait_s=10.0):
            if item.trajectory is not None:
                self._route(item.trajectory)

    def _route(self, t: Trajectory) -> None:
        if t.group_id in self.eval_buffer.sizes:
            if (group := self.eval_buffer.add(t)) is not None:
                self.evals[t.group_id].set_result(group)
        elif t.group_id in self.buffer.sizes:
            if (group := self.buffer.add(t)) is not None:
                self.ready.put_nowait(group)
        else:
            self.unclaimed.setdefault(t.group_id, []).append(t)
            while len(self.unclaimed) > _MAX_UNCLAIMED_GROUPS:
                self.unclaimed.pop(next(iter(self.unclaimed)))

    async def evaluate(self) -> dict:
        cfg = self.cfg
        if not cfg.task.eval_seeds:
            return {}
        t0 = time.monotonic()
        gids = [await self.submit_group(self.step, eval_seed=seed) for seed in range(cfg.task.eval_seeds)]
        groups = await asyncio.gather(*(self.evals[g] for g in gids))
        trajs: list[Trajectory] = [t for g in groups for t in g]
        for g in gids:
            del self.evals[g]
        rec = {
            "eval": True,
            "step": self.step,
            "version": self.trainer.version,
            "success_rate": sum(t.reward >= 1.0 for t in trajs) / len(trajs),
            "reward_mean": sum(t.reward for t in trajs) / len(trajs),
            "n": len(trajs),
            "eval_s": time.monotonic() - t0,
            "elapsed_s": time.monotonic() - self.t0,
        }
        self.eval_history.append(rec)
        self._log(rec)
        console.print(
            f"eval @ step {self.step}: success {rec['success_rate']:.0%} "
            f"({cfg.task.eval_seeds} held-out tasks x {cfg.rollout.eval_samples}, {rec['eval_s']:.0f} s)"
        )
        return rec

    # ------------------------------------------------------------------ weights, checkpoints
    async def publish(self) -> None:
        wdir = self.run_dir / "weights"
        wdir.mkdir(exist_ok=True)
        path = wdir / "policy.safetensors"
        fmt, scale = await asyncio.to_thread(self.trainer.export, path)
        req = WeightUpdateRequest(path=str(path.resolve()), format=fmt, lora_scale=scale, version=self.trainer.version)
        await publish_weights(self.engine_urls, req)
        await self.client.announce(self.trainer.version)

    def checkpoint(self) -> None:
        path = self.run_dir / "checkpoint.pt"
        self.trainer.save(str(path) + ".tmp", extra={"step": self.step, "next_seed": self.next_seed})
        Path(str(path) + ".tmp").replace(path)

    async def _maybe_resume(self) -> None:
        path = self.run_dir / "checkpoint.pt"
        if not (self.cfg.run.resume and path.exists()):
            if self.metrics_path.exists() and not self.cfg.run.resume:
                self.metrics_path.unlink()
            return
        from raas.coordinator.report import load

        extra = await asyncio.to_thread(self.trainer.load, path)
        self.step, self.next_seed = extra["step"], extra["next_seed"]
        self.eval_history = load(self.run_dir)[1]  # so the summary spans the whole run
        await self.publish()
        console.print(f"resumed {self.run_dir} at step {self.step} (policy version {self.trainer.version})")

    # ------------------------------------------------------------------ output
    def _log(self, rec: dict) -> None:
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(rec) + "\n")

    def summary(self) -> int:
        from raas.coordinator.report import plot

        png = plot(self.run_dir)
        wall = time.monotonic() - self.t0
        if len(self.eval_history) >= 2:
            first, last = self.eval_history[0], self.eval_history[-1]
            console.print(
                f"[bold]success rate[/]: {first['success_rate']:.0%} at the first evaluation (step {first['step']}) -> "
                f"{last['success_rate']:.0%} at the last (step {last['step']}), {last['n']} held-out samples each"
            )
        console.print(f"wall time {wall:.0f} s; metrics: {self.metrics_path}; reward curve: {png}")
        return 0


def _count(values) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console,
    )
