"""Plots and a summary of a training run (``raas report RUN_DIR``)."""

from __future__ import annotations

import json
from pathlib import Path


def load(run_dir: Path) -> tuple[list[dict], list[dict]]:
    steps, evals = [], []
    path = Path(run_dir) / "metrics.jsonl"
    if path.exists():
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            (evals if rec.get("eval") else steps).append(rec)
    return steps, evals


def plot(run_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, evals = load(run_dir)
    fig, ax = plt.subplots(figsize=(7, 4))
    if steps:
        ax.plot([s["elapsed_s"] / 60 for s in steps], [s["reward_mean"] for s in steps], ".-", label="train reward (batch mean)")
    if evals:
        ax.plot([e["elapsed_s"] / 60 for e in evals], [e["success_rate"] for e in evals], "o-", lw=2, label="eval success (held-out)")
    ax.set_xlabel("wall-clock minutes")
    ax.set_ylabel("reward / success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(f"raas: {Path(run_dir).name}")
    out = Path(run_dir) / "reward_curve.png"
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def report(run_dir: Path) -> int:
    steps, evals = load(run_dir)
    if not steps and not evals:
        print(f"raas report: no metrics.jsonl in {run_dir}")
        return 2
    for e in evals:
        print(f"eval  step {e['step']:>3}  version {e['version']:>3}  success {e['success_rate']:.0%}  ({e['n']} tasks)")
    if steps:
        s = steps[-1]
        print(f"train {len(steps)} steps, last reward {s['reward_mean']:.2f}, {s['elapsed_s']:.0f} s")
    print(f"plot: {plot(run_dir)}")
    return 0
