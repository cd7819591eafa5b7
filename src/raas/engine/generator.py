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
from raas.engine.prefix_cache import PrefixCache
from raas.tokenseq import common_prefix_len

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


class Generator:
    def __init__(self, model, eos_token_ids: list[int], max_model_len: int, prefix_cache_tokens: int = 16384):
        self.model = model
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
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
        # Requests reuse the longest cached prefix they extend; those sharing one prefill together.
        groups: dict[int, tuple[int, list, list[GenRequest]]] = {}
        for r in live:
            n, kv = self.prefix_cache.longest(r.prompt, len(r.prompt) - 1)
            groups.setdefault(id(kv) if kv is not None else 0, (n, kv, []))[2].append(r)
        for n, kv, reqs_ in groups.values():
            cache, attn, logits = self._prefill([r.prompt for r in reqs_], n, kv)
            rows = [_Row(r, GenResult(), len(r.prompt), _row_generator(r.sampling.seed, self.device)) for r in reqs_]
            keep = self._sample_and_check(rows, logits, finished, cache, attn)
            if keep:
                attn = _keep_rows(cache, attn, keep, len(rows))
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
        keep = self._sample_and_check(self.rows, out.logits[:, -1, :], finished, self.cache, self.attn)
        if len(keep) < len(self.rows):
            if keep:
                self.attn = _keep_rows(self.cache, self.attn, keep, len(self.rows))
                self.rows = [self.rows[k] for k in keep]
                self._trim_left_padding()
            else:
                self.abort()
        return finished

    def abort(self) -> list:
        """Drop every running row; returns their tags (for the caller to fail or retry)."""
        tags = [row.req.tag for row in self.rows]
        self.rows, self.cache, self.attn = [], None, None
        return tags

    # ------------------------------------------------------------------ internals
    def _prefill(self, prompts: list[list[int]], base_len: int = 0, base_kv=None):
        """Prefill on top of a cached prefix of ``base_len`` tokens (if any): the rest of the
        shared prefix once, then per-row suffixes (left-padded, each at least one token)."""
        dev, B = self.device, len(prompts)
        P = common_prefix_len(prompts) if B > 1 else len(prompts[0]) - 1
        P = min(P, min(len(p) for p in prompts) - 1)
        cache = _new_cache(self.model.config)
        if base_kv is not None:
            for layer, (k, v) in zip(cache.layers, base_kv):
                layer.lazy_initialization(k, v)
                layer.keys, layer.values = k, v
        if P - base_len >= _MIN_SHARED_PREFIX:
            ids = torch.tensor([prompts[0][base_len:P]], device=dev)
            pos = torch.arange(base_len, P, device=dev)[None]
            self.model(input_ids=ids, position_ids=pos, cache=cache, use_cache=True)
            if B > 1:  # a group's shared prompt: later turns and later groups start from it
                self.prefix_cache.put(prompts[0][:P], [(la.keys.clone(), la.values.clone()) for la in cache.layers])
        else:
            P = base_len
        if B > 1 and P:
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

    def _sample_and_check(self, rows: list[_Row], logits: torch.Tensor, finished: list, cache, attn) -> list[int]:
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
            self._remember(row, k, cache, attn)
        return keep

    def _remember(self, row: _Row, b: int, cache, attn: torch.Tensor) -> None:
        """Keep a finished row's KV (its prompt and all sampled tokens but the last, which was
        never fed back) for a later request that continues this conversation."""
        tokens = row.req.prompt + row.result.tokens[:-1]
        cols = attn[b].nonzero()[:, 0]  # the row's real KV columns (padding sits between its parts)
        if len(cols) != len(tokens) or len(tokens) < self.prefix_cache.min_tokens:
            return
        kv = [(la.keys[b : b + 1, :, cols], la.values[b : b + 1, :, cols]) for la in cache.layers]
        self.prefix_cache.put(tokens, kv)


def _new_cache(config):
    """A DynamicCache whose full-attention layers append in place into over-allocated buffers:
    transformers' layers re-concatenate the whole cache at every decode step (O(length) copies
    per token, a fifth of decode time at batch 16 here)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    for layer in cache.layers:
        if type(layer) is DynamicLayer:
            layer.__class__ = _GrowingLayer
    return cache


def _grow_layer_base():
    from transformers.cache_utils import DynamicLayer

    return DynamicLayer


class _GrowingLayer(_grow_layer_base()):
    """``keys``/``values`` are views of larger buffers; appends write in place. Any operation that
    replaces ``keys`` (row selection, merging, trimming) is picked up at the next append."""

    _buf: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[-2]
        old_len = self.keys.shape[-2] if self.keys.numel() else 0
        buf = self._buf
        if buf is None or self.keys.numel() == 0 or self.keys.data_ptr() != buf[0].data_ptr() \
                or self.keys.shape[0] != buf[0].shape[0] or old_len + n > buf[0].shape[-2]:
            cap = old_len + n + max(64, (old_len + n) // 2)
            shape = (*key_states.shape[:-2], cap, key_states.shape[-1])
            bk = key_states.new_empty(shape)
            bv = value_states.new_empty((*value_states.shape[:-2], cap, value_states.shape[-1]))
            if old_len:
                bk[..., :old_len, :] = self.keys
                bv[..., :old_len, :] = self.values
            self._buf = buf = (bk, bv)
        buf[0][..., old_len : old_len + n, :] = key_states
        buf[1][..., old_len : old_len + n, :] = value_states
        self.keys = buf[0][..., : old_len + n, :]
        self.values = buf[1][..., : old_len + n, :]
        return self.keys, self.values


def _keep_rows(cache, attn: torch.Tensor, keep: list[int], n_rows: int) -> torch.Tensor:
    """Keep rows ``keep`` of a batch's KV cache (in place) and attention mask (returned)."""
    if len(keep) == n_rows:
        return attn
    idx = torch.tensor(keep, device=attn.device)
    cache.batch_select_indices(idx)
    return attn[idx]


def _lpad(t: torch.Tensor, length: int, dim: int) -> torch.Tensor:
    n = length - t.shape[dim]
    if n <= 0:
        return t
    pad = [0, 0] * (t.dim() - 1 - dim) + [n, 0]
    return F.pad(t, pad)


def _sample(logits: torch.Tensor, sps: list[SamplingParams], gens) -> tuple[list[int], list[float]]:
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)  # the policy's own distribution (temperature 1)
    tokens: list[int | None] = [None] * len(sps)
    # Plain temperature sampling without a seed: one multinomial call for all such rows.
    plain = [k for k, sp in enumerate(sps) if sp.temperature > 0 and not sp.top_k and sp.top_p >= 1.0 and gens[k] is None]
    if plain:
        idx = torch.tensor(plain, device=logits.device)
        temps = torch.tensor([sps[k].temperature for k in plain], device=logits.device)[:, None]
        probs = torch.softmax(logits[idx] / temps, dim=-1)
        # Exponential race: argmax(p / E), E ~ Exp(1), draws from p exactly and is much cheaper
        # than torch.multinomial over a 50k vocabulary on CPU.
        drawn = torch.argmax(probs / torch.empty_like(probs).exponential_(1.0), dim=-1).tolist()
        for k, t in zip(plain, drawn):
            tokens[k] = t
    for k, sp in enumerate(sps):
        if tokens[k] is not None:
            continue
        if sp.temperature == 0.0:
            tokens[k] = int(torch.argmax(logits[k]))
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
        tokens[k] = int(torch.multinomial(probs, 1, generator=gens[k]))
    chosen = logp[torch.arange(len(sps), device=logp.device), torch.tensor(tokens, device=logp.device)]
    return tokens, chosen.tolist()


def _row_generator(seed: int | None, device) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g
