"""One policy-gradient step on a batch of trajectories: GRPO advantages, PPO-clip, AdamW.

The trainer sees only ``Trajectory`` records (tokens, loss mask, rollout log-probs, reward); it
never talks to sandboxes, tools or the rollout service.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

import torch

from raas.contracts import Trajectory
from raas.trainer.algorithms import grpo_advantages, ppo_clip_loss
from raas.trainer.config import TrainerConfig
from raas.trainer.policy import Policy


class Trainer:
    def __init__(self, model_dir: str | Path, cfg: TrainerConfig, device: str = "cpu"):
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        torch.manual_seed(cfg.seed)
        self.cfg = cfg
        self.policy = Policy(
            model_dir, device=device, lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_targets=cfg.lora_targets,
            lora_top_layers=cfg.lora_top_layers,
        )
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=cfg.weight_decay
        )
        self.version = 0

    def step(self, batch: list[Trajectory]) -> dict[str, float]:
        """Update the policy on ``batch``; returns metrics. Advances ``version`` by one."""
        t0 = time.monotonic()
        adv = grpo_advantages([t.reward for t in batch], [t.group_id for t in batch], normalize_std=self.cfg.normalize_std)
        # Zero-advantage samples (groups whose rewards are all equal) carry no gradient: skip them.
        work = [(t, a) for t, a in zip(batch, adv) if abs(a) > 1e-8 and t.num_sampled > 0]
        n_tokens = sum(t.num_sampled for t, _ in work)
        stats: dict[str, list[float]] = defaultdict(list)
        loss_total = 0.0
        for _ in range(self.cfg.updates_per_batch):
            self.optimizer.zero_grad(set_to_none=True)
            for mb in _microbatches(work, self.cfg.micro_batch):
                seqs = [t.tokens for t, _ in mb]
                positions = [[i for i, m in enumerate(t.loss_mask) if m] for t, _ in mb]
                logps = self.policy.token_logprobs(seqs, positions)
                logp = torch.cat(logps)
                old = torch.tensor([lp for t, _ in mb for lp, m in zip(t.logprobs, t.loss_mask) if m], device=logp.device)
                a = torch.tensor([a for (t, a), p in zip(mb, positions) for _ in p], device=logp.device, dtype=logp.dtype)
                loss, s = ppo_clip_loss(
                    logp, old, a, torch.ones_like(logp),
                    clip_low=self.cfg.clip_low, clip_high=self.cfg.clip_high, num_tokens=n_tokens,
                )
                loss.backward()
                loss_total += float(loss.detach())
                for k, v in s.items():
                    stats[k].append(v)
            if work:
                grad_norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.max_grad_norm)
                self.optimizer.step()
                stats["grad_norm"].append(float(grad_norm))
        self.version += 1
        out = {k: sum(v) / len(v) for k, v in stats.items()}
        out.update(
            loss=loss_total / max(1, self.cfg.updates_per_batch),
            train_samples=len(work),
            train_tokens=n_tokens,
            train_s=time.monotonic() - t0,
        )
        return out

    def export(self, path: str | Path) -> tuple[str, float]:
        return self.policy.export(path)

    # ------------------------------------------------------------------ checkpoints
    def save(self, path: str | Path, extra: dict | None = None) -> None:
        torch.save(
            {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(), "version": self.version,
             "extra": extra or {}},
            str(path),
        )

    def load(self, path: str | Path) -> dict:
        ck = torch.load(str(path), map_location="cpu", weights_only=False)
        self.policy.load_state_dict(ck["policy"])
        self.optimizer.load_state_dict(ck["optimizer"])
        self.version = ck["version"]
        return ck.get("extra", {})


def _microbatches(work: list, size: int):
    """One group per microbatch (split above ``size``): a group's samples share the whole task
    prompt, which is then computed once; mixing groups would share only the common system part
    and pad every row to the longest one in the batch."""
    groups: dict[str, list] = {}
    for item in work:
        groups.setdefault(item[0].group_id, []).append(item)
    for items in groups.values():
        items.sort(key=lambda x: len(x[0].tokens))
        for i in range(0, len(items), size):
            yield items[i : i + size]
