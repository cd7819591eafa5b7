"""End to end: `raas train` (the real CLI) starts the real engine and service, trains a tiny
model for a few steps with bounded staleness, publishes weights, and records everything."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from raas.contracts import Trajectory


def run_train(tmp_path, tiny_model, eta: int, steps: int = 3, extra: list[str] = ()) -> tuple[list[dict], list[Trajectory]]:
    cfg = tmp_path / f"eta{eta}.toml"
    cfg.write_text(f"""
[run]
name = "eta{eta}"
out_dir = "{tmp_path}"
steps = {steps}
max_staleness = {eta}
[model]
path = "{tiny_model}"
[task]
env = "calculator"
eval_seeds = 2
[rollout]
group_size = 3
groups_per_step = 2
max_tokens = 12
max_turns = 2
[trainer]
lr = 1e-3
lora_rank = 4
threads = 1
[service]
engine_threads = 1
""")
    argv = [sys.executable, "-m", "raas.cli", "train", str(cfg)]
    for e in extra:
        argv += ["--set", e]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "success rate" in r.stderr
    run_dir = tmp_path / f"eta{eta}"
    recs = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trajs = []
    for line in (run_dir / "service" / "journal.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec["type"] == "result":
            trajs.append(Trajectory.model_validate(rec["trajectory"]))
    assert (run_dir / "reward_curve.png").stat().st_size > 1000
    assert (run_dir / "checkpoint.pt").exists()
    return recs, trajs


@pytest.mark.parametrize("eta", [1, 0])
def test_train_runs_steps_with_bounded_staleness(tmp_path, tiny_model, eta):
    recs, trajs = run_train(tmp_path, tiny_model, eta)
    steps = [r for r in recs if not r.get("eval")]
    evals = [r for r in recs if r.get("eval")]
    assert [s["step"] for s in steps] == [1, 2, 3]
    assert [s["version"] for s in steps] == [1, 2, 3]  # each step publishes a new policy version
    assert [e["version"] for e in evals] == [0, 3]
    assert all(s["staleness_max"] <= eta for s in steps)
    assert all(s["samples"] == 6 for s in steps)
    train = [t for t in trajs if not t.metrics.get("eval")]
    assert train and all(t.num_sampled > 0 for t in train)
    by_step: dict[int, list[Trajectory]] = {}
    for t in train:
        by_step.setdefault(t.metrics["step"], []).append(t)
    # Rollouts for step k are submitted while the policy is at version >= k - eta and were sampled
    # by exactly the versions the engine had: never newer than the trainer had published.
    for k, ts in by_step.items():
        for t in ts:
            assert min(t.sampled_versions) >= k - eta
            assert max(t.sampled_versions) <= 3
    if eta == 0:  # synchronous: step k's samples all come from version k
        assert all(set(t.sampled_versions) == {t.metrics["step"]} for t in train)
    assert max(v for t in trajs for v in t.sampled_versions) >= 2  # later rollouts used newer weights
    final_eval = [t for t in trajs if t.metrics.get("eval") and t.metrics["step"] == 3]
    assert final_eval and all(set(t.sampled_versions) == {3} for t in final_eval)


def test_resume_continues_from_the_checkpoint(tmp_path, tiny_model):
    recs, _ = run_train(tmp_path, tiny_model, 1, steps=2)
    assert [r["step"] for r in recs if not r.get("eval")] == [1, 2]
    recs, trajs = run_train(tmp_path, tiny_model, 1, steps=3, extra=["run.resume=true"])
    steps = [r for r in recs if not r.get("eval")]
    assert [s["step"] for s in steps] == [1, 2, 3]  # the log goes on; nothing was redone
    assert steps[-1]["version"] == 3
    # The resumed run republished version 2 before sampling, so its rollouts are >= version 2.
    resumed = [t for t in trajs if not t.metrics.get("eval") and t.metrics["step"] == 2]
    assert resumed and all(min(t.sampled_versions) >= 2 for t in resumed)
