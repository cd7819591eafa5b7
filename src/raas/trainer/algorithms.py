"""RL objectives as short functions on tensors, named as in the papers.

* GRPO (Shao et al., 2024, DeepSeekMath): the advantage of a sample is its reward standardised
  within its group of samples of the same prompt, ``A_i = (r_i - mean(r)) / (std(r) + eps)``.
* PPO-clip (Schulman et al., 2017) at token level, with the rollout's own log-probabilities as the
  behaviour policy: ``ratio = exp(logp - logp_old)``,
  ``L = -mean_t min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)``. Averaging over all
  sampled tokens of the batch (not per sequence) follows DAPO (Yu et al., 2025), so long answers
  are not down-weighted.
"""

from __future__ import annotations

from collections import defaultdict

import torch


def grpo_advantages(rewards: list[float], group_ids: list[str], *, normalize_std: bool = True, eps: float = 1e-6) -> list[float]:
    groups: dict[str, list[int]] = defaultdict(list)
    for i, g in enumerate(group_ids):
        groups[g].append(i)
    adv = [0.0] * len(rewards)
    for idx in groups.values():
        r = torch.tensor([rewards[i] for i in idx], dtype=torch.float64)
        a = r - r.mean()
        if normalize_std and len(idx) > 1:
            a = a / (r.std(unbiased=True) + eps)
        for i, v in zip(idx, a.tolist()):
            adv[i] = v
    return adv


def ppo_clip_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    num_tokens: int | float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level PPO-clip loss. All tensors have the same shape; ``mask`` is 1 on sampled tokens.

    ``num_tokens`` is the denominator (sampled tokens in the whole batch) so microbatches add up to
    the batch mean; defaults to ``mask.sum()``.
    """
    mask = mask.to(logp.dtype)
    denom = float(num_tokens if num_tokens is not None else mask.sum().clamp(min=1))
    log_ratio = (logp - logp_old) * mask
    ratio = torch.exp(log_ratio)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -(torch.minimum(unclipped, clipped) * mask).sum() / denom
    with torch.no_grad():
        n = mask.sum().clamp(min=1)
        stats = {
            "clipfrac": float(((unclipped != clipped).to(mask.dtype) * mask).sum() / n),
            # k3 estimator of KL(old || new) (Schulman, "Approximating KL divergence")
            "approx_kl": float(((ratio - 1) - log_ratio).mul(mask).sum() / n),
            "ratio_mean": float((ratio * mask).sum() / n),
        }
    return loss, stats
