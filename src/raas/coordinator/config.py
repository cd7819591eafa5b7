"""Run configuration: TOML file + ``--set key=value`` overrides, validated per section.

Each component receives only its own section: ``[trainer]`` goes to the trainer, ``[rollout]``
and ``[task]`` shape the jobs the coordinator submits, ``[service]`` says where the rollout
service is (or how to start one).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from raas.trainer.config import TrainerConfig


class ConfigError(ValueError):
    pass


class RunSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field("run", description="run name; the run directory is out_dir/name")
    out_dir: str = Field("runs", description="parent folder of run directories")
    steps: int = Field(20, ge=1, description="training steps (policy versions) to run")
    max_staleness: int = Field(1, ge=0, description="eta: rollouts may lag the policy by this many versions; 0 = synchronous")
    eval_every: int = Field(0, ge=0, description="evaluate every N steps (0: only before and after training)")
    checkpoint_every: int = Field(0, ge=0, description="save a resumable checkpoint every N steps (0: at the end only)")
    resume: bool = Field(False, description="continue from the run directory's checkpoint if there is one")
    seed: int = 0


class ModelSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field("SmolLM2-135M-Instruct", description="HF model directory or the default model's name")
    device: str = Field("cpu", description="cpu or cuda, for the trainer")


class TaskSection(BaseModel):
    model_config = ConfigDict(extra="allow")

    env: str = Field("calculator", description="environment name; other keys are instance fields")
    train_seed_start: int = Field(10_000, description="training tasks use seeds from here upwards")
    eval_seeds: int = Field(32, ge=0, description="evaluation tasks use seeds 0 .. eval_seeds-1")


class SamplingSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    group_size: int = Field(8, ge=1, description="samples per task (a GRPO group)")
    groups_per_step: int = Field(2, ge=1, description="tasks per training batch")
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(64, ge=1, description="tokens per assistant turn")
    max_turns: int = Field(4, ge=1)
    max_total_tokens: int | None = Field(None, ge=1)
    timeout_s: float = Field(600.0, gt=0)
    eval_temperature: float = Field(1.0, ge=0, description="evaluation sampling temperature (0 = greedy)")
    eval_samples: int = Field(2, ge=1, description="samples per held-out task at each evaluation")


class ServiceSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field("", description="rollout service URL; empty starts one (and the embedded engine) locally")
    engine_urls: list[str] = Field(default_factory=list, description="engines to publish weights to (default: the service's)")
    engine_threads: int | None = Field(None, ge=1, description="torch threads of the embedded engine")
    run_workers: int = Field(64, ge=1)


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    run: RunSection = Field(default_factory=RunSection)
    model: ModelSection = Field(default_factory=ModelSection)
    task: TaskSection = Field(default_factory=TaskSection)
    rollout: SamplingSection = Field(default_factory=SamplingSection)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    service: ServiceSection = Field(default_factory=ServiceSection)

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        if self.rollout.group_size < 2:
            raise ValueError("rollout.group_size: GRPO needs at least 2 samples per task")
        return self

    @property
    def run_dir(self) -> Path:
        return Path(self.run.out_dir) / self.run.name


def _parse_value(v: str) -> Any:
    try:
        return tomllib.loads(f"x = {v}")["x"]
    except tomllib.TOMLDecodeError:
        return v  # a bare string


def load_config(path: str | Path, overrides: list[str]) -> RunConfig:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist")
    try:
        data = tomllib.loads(p.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None
    for o in overrides:
        if "=" not in o:
            raise ConfigError(f"--set {o!r}: expected section.key=value, e.g. trainer.lr=1e-5")
        key, val = o.split("=", 1)
        parts = key.strip().split(".")
        node = data
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {part!r} is not a section")
        node[parts[-1]] = _parse_value(val.strip())
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        msgs = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"{path}: {msgs}") from None


def dump(cfg: RunConfig) -> str:
    return json.dumps(cfg.model_dump(mode="json"), indent=2)
