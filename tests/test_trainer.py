"""Trainer: the algorithms against hand-computed values, exact gradients through the shared
prefix, a real step on a tiny real model, and weights published to a real engine."""

from __future__ import annotations

import math

import httpx
import pytest
import torch

from raas.contracts import Trajectory
from raas.engine.core import Engine
from raas.engine.server import create_app
from raas.trainer.algorithms import grpo_advantages, ppo_clip_loss
from raas.trainer.config import TrainerConfig
from raas.trainer.policy import Policy
from raas.trainer.trainer import Trainer
from tests.conftest import ServerThread


def test_grpo_advantages_by_hand():
    adv = grpo_advantages([1, 0, 0, 1, 1, 1], ["a", "a", "a", "a", "b", "b"])
    s = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
    assert adv[:4] == pytest.approx([0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s], rel=1e-5)
    assert adv[4:] == [0.0, 0.0]  # all equal: no signal
    assert grpo_advantages([2.0, 0.0], ["a", "a"], normalize_std=False) == [1.0, -1.0]


def test_ppo_clip_loss_by_hand():
    old = torch.log(torch.tensor([0.5, 0.5, 0.5]))
    new = torch.log(torch.tensor([0.9, 0.5, 0.2]))  # ratios 1.8, 1.0, 0.4
    adv = torch.tensor([1.0, 1.0, -1.0])
    loss, stats = ppo_clip_loss(new, old, adv, torch.ones(3), clip_low=0.2, clip_high=0.2)
    # token 0: min(1.8, 1.2) * 1 = 1.2; token 1: 1.0; token 2: min(-0.4, -0.8) = -0.8
    assert float(loss) == pytest.approx(-(1.2 + 1.0 - 0.8) / 3, rel=1e-6)
    assert stats["clipfrac"] == pytest.approx(2 / 3)
    masked, _ = ppo_clip_loss(new, old, adv, torch.tensor([1.0, 1.0, 0.0]), num_tokens=4)
    assert float(masked) == pytest.approx(-(1.2 + 1.0) / 4, rel=1e-6)


@pytest.mark.parametrize("rank", [0, 4])
def test_shared_prefix_logprobs_and_gradients_are_exact(tiny_model, rank):
    torch.manual_seed(0)
    prefix = torch.randint(0, 40000, (24,)).tolist()
    seqs = [prefix + torch.randint(0, 40000, (n,)).tolist() for n in (6, 11, 3)]
    positions = [list(range(20, len(s))) for s in seqs]  # some wanted tokens lie inside the shared prefix
    shared = Policy(tiny_model, lora_rank=rank)
    single = Policy(tiny_model, lora_rank=rank)
    single.load_state_dict(shared.state_dict())
    a = shared.token_logprobs(seqs, positions)
    b = [single.token_logprobs([s], [p])[0] for s, p in zip(seqs, positions)]  # no sharing at batch size 1
    for x, y in zip(a, b):
        assert torch.allclose(x, y, atol=1e-5)
    torch.cat(a).sum().backward()
    torch.cat(b).sum().backward()
    for (n, p), q in zip(shared.model.named_parameters(), single.model.parameters()):
        if p.requires_grad:
            assert torch.allclose(p.grad, q.grad, atol=1e-4, rtol=1e-3), n


def make_batch(tokenizer, rewards: list[float], policy: Policy, group: str = "g") -> list[Trajectory]:
    """On-policy samples: the behaviour log-probs are the policy's own."""
    prompt = tokenizer.encode("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
    out = []
    for i, r in enumerate(rewards):
        ans = tokenizer.encode(f"Answer: {4 if r else 5}<|im_end|>")
        with torch.no_grad():
            lps = policy.token_logprobs([prompt + ans], [list(range(len(prompt), len(prompt) + len(ans)))])[0].tolist()
        out.append(Trajectory(
            id=f"r{i}", group_id=group, task_id="t", env="calculator", tokens=prompt + ans,
            loss_mask=[0] * len(prompt) + [1] * len(ans), logprobs=[0.0] * len(prompt) + lps,
            versions=[-1] * len(prompt) + [0] * len(ans), reward=r,
        ))
    return out


def test_train_step_moves_the_policy_towards_rewarded_answers(tiny_model, tokenizer):
    tr = Trainer(tiny_model, TrainerConfig(lr=5e-3, lora_rank=8))
    batch = make_batch(tokenizer, [1.0, 0.0, 1.0, 0.0], tr.policy)
    good, bad = batch[0], batch[1]

    def logp(t):
        with torch.no_grad():
            return float(tr.policy.token_logprobs([t.tokens], [[i for i, m in enumerate(t.loss_mask) if m]])[0].sum())

    before = (logp(good), logp(bad))
    for _ in range(3):
        stats = tr.step(batch)
    assert tr.version == 3 and stats["train_samples"] == 4
    # The answers differ in one digit; the policy must come to prefer the rewarded one.
    assert logp(good) - logp(bad) > before[0] - before[1] + 0.5
    # A batch without signal (all rewards equal) changes nothing but still counts as a version.
    sd = {k: v.clone() for k, v in tr.policy.state_dict().items()}
    stats = tr.step(make_batch(tokenizer, [1.0, 1.0], tr.policy))
    assert stats["train_samples"] == 0 and tr.version == 4
    assert all(torch.equal(sd[k], v) for k, v in tr.policy.state_dict().items())


@pytest.mark.parametrize("rank", [0, 8])
def test_published_weights_make_the_engine_follow_the_policy(tiny_model, tokenizer, tmp_path, rank):
    tr = Trainer(tiny_model, TrainerConfig(lr=5e-2, lora_rank=rank))
    tr.step(make_batch(tokenizer, [1.0, 0.0], tr.policy))
    fmt, scale = tr.export(tmp_path / "w.safetensors")
    assert fmt == ("lora" if rank else "full")
    engine = Engine(tiny_model, threads=1)
    prompt = tokenizer.encode("<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    with ServerThread(create_app(engine)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        r = c.post("/v1/weights", json={"path": str(tmp_path / "w.safetensors"), "format": fmt, "lora_scale": scale, "version": tr.version})
        assert r.status_code == 200, r.text
        out = c.post("/v1/generate", json={"prompt_token_ids": prompt, "sampling": {"max_tokens": 6, "seed": 0}}).json()
    engine.close()
    assert out["version"] == tr.version == 1
    with torch.no_grad():
        ours = tr.policy.token_logprobs([prompt + out["output_token_ids"]], [list(range(len(prompt), len(prompt) + len(out["output_token_ids"])))])[0]
    assert torch.allclose(ours, torch.tensor(out["logprobs"]), atol=1e-4)
