"""The embedded inference engine: one model, one batching thread, a policy version.

Requests from any number of HTTP handlers land on one queue. A single worker thread owns the
model: between two decode steps it admits every waiting request into the running batch (up to
``max_batch`` rows). A weight update is a queue item too: requests that arrived before it finish
on the old weights, requests that arrived after it wait, the update runs when the batch is empty,
and so every response is tagged with the one policy version whose weights produced all its tokens.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import torch

from raas import models
from raas.contracts import GenerateResponse, SamplingParams, WeightUpdateRequest, WeightUpdateResponse
from raas.engine.generator import GenRequest, Generator

log = logging.getLogger(__name__)


class WeightError(ValueError):
    """A weight update that does not fit the model (unknown tensor, wrong shape)."""


@dataclass
class _Gen:
    req: GenRequest  # req.tag is the request's Future
    after_update: int = 0  # weight updates that must be applied before this request may start

    @property
    def fut(self) -> Future:
        return self.req.tag


@dataclass
class _Update:
    req: WeightUpdateRequest
    fut: Future


class Engine:
    def __init__(
        self,
        model_dir: str | Path,
        *,
        device: str = "cpu",
        max_batch: int = 32,
        batch_wait_s: float = 0.005,
        threads: int | None = None,
        max_model_len: int | None = None,
    ):
        if threads:
            torch.set_num_threads(threads)
        self.model_dir = str(model_dir)
        self.device = device
        self.model, self.tokenizer = models.load(model_dir, device)
        cfg = self.model.config
        self.max_model_len = max_model_len or int(getattr(cfg, "max_position_embeddings", 4096))
        eos = self.model.generation_config.eos_token_id if self.model.generation_config else None
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos_ids.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = sorted(eos_ids)
        self.generator = Generator(self.model, self.eos_token_ids, self.max_model_len)
        self.version = 0
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self._q: queue.Queue = queue.Queue()
        self._lora_base: dict[str, torch.Tensor] = {}
        self.stats = {"requests": 0, "steps": 0, "tokens": 0, "max_active": 0}
        self._thread = threading.Thread(target=self._loop, name="raas-engine", daemon=True)
        self._stop = False
        self._thread.start()

    # ------------------------------------------------------------------ public (thread-safe)
    async def generate(self, prompt: list[int], sampling: SamplingParams) -> GenerateResponse:
        fut: Future = Future()
        self._q.put(_Gen(GenRequest(prompt, sampling, tag=fut)))
        return await asyncio.wrap_future(fut)

    async def update_weights(self, req: WeightUpdateRequest) -> WeightUpdateResponse:
        fut: Future = Future()
        self._q.put(_Update(req, fut))
        return await asyncio.wrap_future(fut)

    def close(self) -> None:
        self._stop = True
        self._q.put(None)
        self._thread.join(timeout=10)

    # ------------------------------------------------------------------ worker thread
    def _loop(self) -> None:
        gen = self.generator
        waiting: list[_Gen] = []  # accepted, not yet admitted (batch full, or behind a weight update)
        updates: list[_Update] = []
        while not self._stop:
            items = self._take(block=not (gen.active or waiting or updates))
            for item in items:
                if item is None:
                    self._stop = True
                elif isinstance(item, _Update):
                    updates.append(item)
                elif updates:  # arrived after a weight update: must run on the new weights
                    item.after_update = len(updates)
                    waiting.append(item)
                else:
                    waiting.append(item)
            # Admit what may run on the current weights, up to the batch limit.
            room = self.max_batch - gen.active
            now = [w for w in waiting if not w.after_update][: max(0, room)]
            if now:
                taken = {id(w) for w in now}
                waiting = [w for w in waiting if id(w) not in taken]
                self._resolve(self._guard(functools.partial(gen.admit, [w.req for w in now]), now))
            if gen.active:
                self._resolve(self._guard(gen.step, None))
            elif updates:  # the batch drained: weights can change between two tokens of no one
                self._run_update(updates.pop(0))
                for w in waiting:
                    w.after_update = max(0, w.after_update - 1)
        for w in waiting:
            w.fut.set_exception(RuntimeError("engine stopped"))

    def _take(self, block: bool) -> list:
        """Everything on the queue now; if ``block``, wait for the first item and then briefly
        for a burst (requests of one group arrive within milliseconds of each other)."""
        items = []
        if block:
            items.append(self._q.get())
            deadline = time.monotonic() + self.batch_wait_s
            while (left := deadline - time.monotonic()) > 0:
                try:
                    items.append(self._q.get(timeout=left))
                except queue.Empty:
                    break
        while True:
            try:
                items.append(self._q.get_nowait())
            except queue.Empty:
                return items

    def _guard(self, fn, admitted: list[_Gen] | None):
        """Run a generator call; on failure fail the affected requests, never the engine."""
        try:
            return fn()
        except Exception as e:
            log.exception("generation failed")
            futs = self.generator.abort() + [w.fut for w in admitted or []]
            for fut in {id(f): f for f in futs}.values():
                if not fut.done():
                    fut.set_exception(e)
            return []

    def _resolve(self, finished) -> None:
        self.stats["steps"] += 1
        self.stats["max_active"] = max(self.stats["max_active"], self.generator.active + len(finished))
        for req, res in finished:
            self.stats["requests"] += 1
            self.stats["tokens"] += len(res.tokens)
            if not req.tag.done():
                req.tag.set_result(
                    GenerateResponse(
                        output_token_ids=res.tokens, logprobs=res.logprobs, version=self.version,
                        finish_reason=res.finish_reason,
                    )
                )

    def _run_update(self, item: _Update) -> None:
        try:
            item.fut.set_result(self._load_weights(item.req))
        except Exception as e:
            item.fut.set_exception(e)

    @torch.no_grad()
    def _load_weights(self, req: WeightUpdateRequest) -> WeightUpdateResponse:
        from safetensors.torch import load_file

        t0 = time.monotonic()
        path = Path(req.path)
        if not path.is_file():
            raise WeightError(f"path: no such file {req.path!r} on the engine's machine")
        tensors = load_file(str(path))
        params = dict(self.model.named_parameters())
        if req.format == "full":
            for name, t in tensors.items():
                if name not in params:
                    raise WeightError(f"path: tensor {name!r} is not a parameter of this model")
                if params[name].shape != t.shape:
                    raise WeightError(f"path: tensor {name!r} has shape {tuple(t.shape)}, model has {tuple(params[name].shape)}")
            for name, t in tensors.items():
                params[name].copy_(t.to(params[name].dtype))
                self._lora_base.pop(name, None)
            n = len(tensors)
        else:
            modules = sorted({k.rsplit(".lora_", 1)[0] for k in tensors if ".lora_" in k})
            if not modules:
                raise WeightError("path: no '<module>.lora_A' / '<module>.lora_B' tensors in the file")
            for mod in modules:
                a, b, w = tensors.get(f"{mod}.lora_A"), tensors.get(f"{mod}.lora_B"), params.get(f"{mod}.weight")
                if a is None or b is None:
                    raise WeightError(f"path: module {mod!r} needs both lora_A and lora_B")
                if w is None:
                    raise WeightError(f"path: {mod + '.weight'!r} is not a parameter of this model")
                if (b.shape[0], a.shape[1]) != tuple(w.shape) or a.shape[0] != b.shape[1]:
                    raise WeightError(f"path: LoRA shapes for {mod!r} do not match weight {tuple(w.shape)}")
            for mod in modules:
                name = f"{mod}.weight"
                w = params[name]
                base = self._lora_base.setdefault(name, w.detach().clone())
                delta = req.lora_scale * (tensors[f"{mod}.lora_B"].float() @ tensors[f"{mod}.lora_A"].float())
                w.copy_((base.float() + delta).to(w.dtype))
            n = len(modules)
        self.generator.prefix_cache.clear()  # cached KV was computed by the old weights
        self.version = req.version if req.version is not None else self.version + 1
        return WeightUpdateResponse(version=self.version, tensors=n, seconds=time.monotonic() - t0)
