"""Continuous batching of token-in/token-out generation on a transformers causal LM.

The generator knows nothing about chat templates or text: it maps prompt token ids and sampling
settings to output token ids, the policy's log-probability of each, and a finish reason.

Why our own loop rather than transformers' continuous batching: we need, per request, its own
temperature / top-p / top-k / seed and the *raw* log-probability of every sampled token under the
policy (PPO's behaviour policy), and a shared-prefix prefill, on CPU as on GPU.

How it batches:

* requests join the running batch at any decode step (``admit``), so the second turn of an
  episode does not wait for the longest sequence of the first batch to finish;
* the requests admitted together share their longest common prefix (a group's prompt, earlier
  turns): it is prefilled once at batch size 1 and its KV cache repeated across their rows;
* rows are padded on the left of their KV cache (attention mask 0 there) and carry explicit
  position ids, so every row computes exactly what an unpadded run would;
* finished rows leave the batch (and the cache) at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from raas.contracts import SamplingParams

_MIN_SHARED_PREFIX = 8  # shorter common prefixes are not worth a separate forward pass


@dataclass
class GenRequest:
    prompt: list[int]
    sampling: SamplingParams
    tag: Any = None  # opaque to the generator; handed back with the result


@dataclass
class GenResult:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"


@dataclass
class _Row:
    req: GenRequest
    result: GenResult
    next_pos: int
    gen: torch.Generator | None


def common_prefix_len(seqs: list[list[int]]) -> int:
    first = seqs[0]
    n = min(len(s) for s in seqs)
    for i in range(n):
        t = first[i]
        if any(s[i] != t for s in seqs):
            return i
    return n


class Generator:
    def __init__(self, model, eos_token_ids: list[int], max_model_len: int):
        self.model = model
        self.eos = set(eos_token_ids)
        self.max_model_len = max_model_len
        self.device = next(model.parameters()).device
        self.rows: list[_Row] = []
        self.cache = None
        self.attn: torch.Tensor | None = None  # (rows, kv_len): 1 where a row has a real token

    @property
    def active(self) -> int:
        return len(self.rows)

    # ------------------------------------------------------------------ public
    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        """Run ``reqs`` to completion (convenience for callers without a queue)."""
        done = self.admit(reqs)
        while self.rows:
            done += self.step()
        by_id = {id(r): res for r, res in done}
        return [by_id[id(r)] for r in reqs]

    @torch.inference_mode()
    def admit(self, reqs: list[GenRequest]) -> list[tuple[GenRequest, GenResult]]:
        """Prefill ``reqs``, sample their first token and add them to the running batch.
        Returns the requests that already finished."""
        finished: list[tuple[GenRequest, GenResult]] = []
        live = []
        for r in reqs:
            if len(r.prompt) >= self.max_model_len:
                finished.append((r, GenResult(finish_reason="length")))
            else:
                live.append(r)
        if not live:
            return finished
        cache, attn, logits = self._prefill([r.prompt for r in live])
        rows = [_Row(r, GenResult(), len(r.prompt), _row_generator(r.sampling.seed, self.device)) for r in live]
        keep = self._sample_and_check(rows, logits, finished)
        if keep:
            idx = torch.tensor(keep, device=self.device)
            if len(keep) < len(rows):
                cache.batch_select_indices(idx)
                attn = attn[idx]
            self._merge([rows[k] for k in keep], cache, attn)
        return finished

    @torch.inference_mode()
    def step(self) -> list[tuple[GenRequest, GenResult]]:
        """One decode step for every running row. Returns the requests that finished."""
        if not self.rows:
            return []
        dev = self.device
        last = torch.tensor([[row.result.tokens[-1]] for row in self.rows], device=dev)
        pos = torch.tensor([[row.next_pos] for row in self.rows], device=dev)
        self.attn = torch.cat([self.attn, torch.ones((len(self.rows), 1), dtype=self.attn.dtype, device=dev)], dim=1)
        out = self.model(input_ids=last, attention_mask=self.attn, position_ids=pos, cache=self.cache, use_cache=True)
        for row in self.rows:
            row.next_pos += 1
        finished: list[tuple[GenRequest, GenResult]] = []
        keep = self._sample_and_check(self.rows, out.logits[:, -1, :], finished)
        if len(keep) < len(self.rows):
            if keep:
                idx = torch.tensor(keep, device=dev)
                self.cache.batch_select_indices(idx)
                self.attn = self.attn[idx]
                self.rows = [self.rows[k] for k in keep]
                self._trim_left_padding()
            else:
                self.rows, self.cache, self.attn = [], None, None
        return finished

    # ------------------------------------------------------------------ internals
    def _prefill(self, prompts: list[list[int]]):
        """Shared prefix once, then per-row suffixes (left-padded, each at least one token)."""
        from transformers import DynamicCache

        dev, B = self.device, len(prompts)
        P = common_prefix_len(prompts) if B > 1 else 0
        P = min(P, min(len(p) for p in prompts) - 1)
        if P < _MIN_SHARED_PREFIX:
            P = 0
        cache = DynamicCache(config=self.model.config)
        if P:
            self.model(input_ids=torch.tensor([prompts[0][:P]], device=dev), cache=cache, use_cache=True)
            if B > 1:
                cache.batch_repeat_interleave(B)
        suffixes = [p[P:] for p in prompts]
        L = max(len(s) for s in suffixes)
        ids = torch.zeros((B, L), dtype=torch.long, device=dev)
        attn = torch.zeros((B, P + L), dtype=torch.long, device=dev)
        attn[:, :P] = 1
        pos = torch.zeros((B, L), dtype=torch.long, device=dev)
        for b, s in enumerate(suffixes):
            n = len(s)
            ids[b, L - n :] = torch.tensor(s, device=dev)
            attn[b, P + L - n :] = 1
            pos[b, L - n :] = torch.arange(P, P + n, device=dev)
        out = self.model(
            input_ids=ids, attention_mask=attn, position_ids=pos, cache=cache, use_cache=True, logits_to_keep=1
        )
        return cache, attn, out.logits[:, -1, :]

    def _merge(self, rows: list[_Row], cache, attn: torch.Tensor) -> None:
        """Append new rows to the running batch, left-padding whichever KV cache is shorter."""
        if not self.rows:
            self.rows, self.cache, self.attn = rows, cache, attn
            return
        L_old, L_new = self.attn.shape[1], attn.shape[1]
        L = max(L_old, L_new)
        for old, new in zip(self.cache.layers, cache.layers):
            old.keys = torch.cat([_lpad(old.keys, L, dim=2), _lpad(new.keys, L, dim=2)])
            old.values = torch.cat([_lpad(old.values, L, dim=2), _lpad(new.values, L, dim=2)])
        self.attn = torch.cat([_lpad(self.attn, L, dim=1), _lpad(attn, L, dim=1)])
        self.rows += rows

    def _trim_left_padding(self) -> None:
        """Drop KV columns that no remaining row attends to (left over from finished rows)."""
        used = self.attn.any(dim=0).nonzero()
        first = int(used[0]) if len(used) else 0
        if first > 0:
            self.attn = self.attn[:, first:]
            for layer in self.cache.layers:
                layer.keys = layer.keys[:, :, first:]
                layer.values = layer.values[:, :, first:]

    def _sample_and_check(self, rows: list[_Row], logits: torch.Tensor, finished: list) -> list[int]:
        tokens, lps = _sample(logits, [r.req.sampling for r in rows], [r.gen for r in rows])
        keep = []
        for k, row in enumerate(rows):
            res, sp, t = row.result, row.req.sampling, tokens[k]
            res.tokens.append(t)
            res.logprobs.append(lps[k])
            if t in self.eos or t in sp.stop_token_ids:
                res.finish_reason = "stop"
            elif len(res.tokens) >= sp.max_tokens or len(row.req.prompt) + len(res.tokens) >= self.max_model_len:
                res.finish_reason = "length"
            else:
                keep.append(k)
                continue
            finished.append((row.req, res))
        return keep


def _lpad(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    n = length - t.shape[dim]
    if n <= 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim) + [n, 0]
    return F.pad(t, pad)


def _sample(logits: torch.Tensor, sps: list[SamplingParams], gens) -> tuple[list[int], list[float]]:
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)  # the policy's own distribution (temperature 1)
    tokens: list[int] = []
    for k, sp in enumerate(sps):
        if sp.temperature == 0.0:
            tokens.append(int(torch.argmax(logits[k])))
            continue
        z = logits[k] / sp.temperature
        if sp.top_k and sp.top_k < z.numel():
            kth = torch.topk(z, sp.top_k).values[-1]
            z = z.masked_fill(z < kth, -math.inf)
        probs = torch.softmax(z, dim=-1)
        if sp.top_p < 1.0:
            sp_probs, sp_idx = torch.sort(probs, descending=True)
            cum = torch.cumsum(sp_probs, dim=-1)
            sp_probs[cum - sp_probs > sp.top_p] = 0.0  # keep the smallest set whose mass reaches top_p
            probs = torch.zeros_like(probs).scatter_(0, sp_idx, sp_probs)
        tokens.append(int(torch.multinomial(probs, 1, generator=gens[k])))
    chosen = logp[torch.arange(len(sps), device=logp.device), torch.tensor(tokens, device=logp.device)]
    return tokens, chosen.tolist()


def _row_generator(seed: int | None, device) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g
