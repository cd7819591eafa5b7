"""The command line answers bad input with a message saying what to fix, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from raas.coordinator.config import ConfigError, load_config


def raas(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raas.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "toml,sets,needle",
    [
        ("[trainer]\nlr = 5\n", [], "trainer.lr"),
        ("[trainer]\nlearning_rate = 0.1\n", [], "trainer.learning_rate"),
        ("[rollout]\ngroup_size = 1\n", [], "rollout.group_size"),
        ("[run]\nsteps = 'many'\n", [], "run.steps"),
        ("[run\n", [], "not valid TOML"),
        ("", ["trainer.lr"], "expected section.key=value"),
        ("", ["run.max_staleness=-1"], "run.max_staleness"),
    ],
)
def test_bad_configs_name_the_key(tmp_path, toml, sets, needle):
    p = tmp_path / "c.toml"
    p.write_text(toml)
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_config(p, sets)


def test_overrides_are_typed(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[run]\nsteps = 3\n")
    cfg = load_config(p, ["run.steps=7", "trainer.lr=3e-4", "run.name=abc", "service.engine_urls=['http://x:1']"])
    assert cfg.run.steps == 7 and cfg.trainer.lr == 3e-4 and cfg.run.name == "abc"
    assert cfg.service.engine_urls == ["http://x:1"]


def test_cli_errors_are_messages_not_tracebacks(tmp_path):
    r = raas("train", str(tmp_path / "missing.toml"))
    assert r.returncode == 2 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("[trainer]\nlr = -1\n")
    r = raas("train", str(bad))
    assert r.returncode == 2 and "trainer.lr" in r.stderr and "Traceback" not in r.stderr
    r = raas("bench", "nope")
    assert r.returncode == 2 and "invalid choice" in r.stderr
    r = raas("model", "prepare", "no-such-model")
    assert r.returncode == 2 and "unknown model" in r.stderr and "Traceback" not in r.stderr
