"""Batched token-in/token-out generation on a transformers causal LM.

The generator knows nothing about chat templates or text: it maps prompt token ids and sampling
settings to output token ids, the policy's log-probability of each, and a finish reason.

Batching (why not transformers' continuous batching): we need, per request, its own temperature /
top-p / top-k / seed and the *raw* log-probability of every sampled token under the policy (the
behaviour policy of PPO's importance ratio), and a shared-prefix prefill, on CPU. So the batch
loop is our own, kept simple:

* all prompts in a batch share their longest common prefix (system prompt, few-shot example,
  earlier turns of the same task). It is prefilled once at batch size 1 and the KV cache is
  repeated across rows, so a group of n samples pays for its prompt once, not n times;
* the per-row suffixes are padded *between* prefix and suffix (attention mask 0 there, explicit
  position ids), so every row's positions are exactly those of an unpadded run;
* rows that finish are dropped from the batch (and the cache) at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from raas.contracts import SamplingParams

_MIN_SHARED_PREFIX = 8  # shorter common prefixes are not worth a separate forward pass


@dataclass
class GenRequest:
    prompt: list[int]
    sampling: SamplingParams


@dataclass
class GenResult:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = "length"


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

    @torch.inference_mode()
    def generate(self, reqs: list[GenRequest]) -> list[GenResult]:
        from transformers import DynamicCache

        dev = self.device
        B = len(reqs)
        results = [GenResult() for _ in reqs]
        for i, r in enumerate(reqs):
            if len(r.prompt) >= self.max_model_len:
                results[i].finish_reason = "length"
        live = [i for i, r in enumerate(reqs) if len(r.prompt) < self.max_model_len]
        if not live:
            return results
        prompts = [reqs[i].prompt for i in live]
        B = len(live)

        # --- prefill: shared prefix once, then per-row suffixes (each at least one token).
        P = common_prefix_len(prompts) if B > 1 else 0
        P = min(P, min(len(p) for p in prompts) - 1)
        if P < _MIN_SHARED_PREFIX:
            P = 0
        cache = DynamicCache(config=self.model.config)
        if P:
            ids = torch.tensor([prompts[0][:P]], device=dev)
            self.model(input_ids=ids, cache=cache, use_cache=True)
            if B > 1:
                cache.batch_repeat_interleave(B)
        suffixes = [p[P:] for p in prompts]
        L = max(len(s) for s in suffixes)
        input_ids = torch.full((B, L), 0, dtype=torch.long, device=dev)
        attn = torch.zeros((B, P + L), dtype=torch.long, device=dev)
        attn[:, :P] = 1
        pos = torch.zeros((B, L), dtype=torch.long, device=dev)
        for b, s in enumerate(suffixes):
            n = len(s)
            input_ids[b, L - n :] = torch.tensor(s, device=dev)
            attn[b, P + L - n :] = 1
            pos[b, L - n :] = torch.arange(P, P + n, device=dev)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attn,
            position_ids=pos,
            cache=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        logits = out.logits[:, -1, :]
        next_pos = torch.tensor([len(p) for p in prompts], device=dev)

        gens = [_row_generator(reqs[i].sampling.seed, dev) for i in live]
        rows = list(range(B))  # rows[k] = index into live of the k-th row still in the batch
        while rows:
            tokens, lps = self._sample(logits, [reqs[live[r]].sampling for r in rows], [gens[r] for r in rows])
            keep = []
            for k, r in enumerate(rows):
                res = results[live[r]]
                sp = reqs[live[r]].sampling
                t = tokens[k]
                res.tokens.append(t)
                res.logprobs.append(lps[k])
                total = len(prompts[r]) + len(res.tokens)
                if t in self.eos or t in sp.stop_token_ids:
                    res.finish_reason = "stop"
                elif len(res.tokens) >= sp.max_tokens or total >= self.max_model_len:
                    res.finish_reason = "length"
                else:
                    keep.append(k)
            if not keep:
                break
            if len(keep) < len(rows):
                idx = torch.tensor(keep, device=dev)
                cache.batch_select_indices(idx)
                attn = attn[idx]
                next_pos = next_pos[idx]
                rows = [rows[k] for k in keep]
                last = torch.tensor([[tokens[k]] for k in keep], device=dev)
            else:
                last = torch.tensor([[t] for t in tokens], device=dev)
            attn = torch.cat([attn, torch.ones((len(rows), 1), dtype=attn.dtype, device=dev)], dim=1)
            out = self.model(
                input_ids=last,
                attention_mask=attn,
                position_ids=next_pos[:, None],
                cache=cache,
                use_cache=True,
            )
            next_pos = next_pos + 1
            logits = out.logits[:, -1, :]
        return results

    @staticmethod
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
                drop = cum - sp_probs > sp.top_p  # keep the smallest set whose mass reaches top_p
                sp_probs[drop] = 0.0
                probs = torch.zeros_like(probs).scatter_(0, sp_idx, sp_probs)
            tokens.append(int(torch.multinomial(probs, 1, generator=gens[k])))
        rows = torch.arange(len(sps), device=logp.device)
        chosen = logp[rows, torch.tensor(tokens, device=logp.device)]
        return tokens, chosen.tolist()


def _row_generator(seed: int | None, device) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g
