"""Trainer configuration (the ``[trainer]`` section of a run's TOML)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TrainerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lr: float = Field(1e-5, gt=0, lt=1, description="AdamW learning rate")
    weight_decay: float = Field(0.0, ge=0)
    lora_rank: int = Field(0, ge=0, le=512, description="LoRA rank; 0 trains all weights")
    lora_alpha: float = Field(32.0, gt=0, description="LoRA scale is alpha / rank")
    lora_targets: list[str] | None = Field(None, description="module names to adapt; default all linear layers")
    lora_top_layers: int | None = Field(
        None, ge=1, description="adapt only the top N transformer layers (backward stops below them); default all"
    )
    clip_low: float = Field(0.2, gt=0, lt=1, description="PPO clip: ratio >= 1 - clip_low")
    clip_high: float = Field(0.28, gt=0, lt=10, description="PPO clip: ratio <= 1 + clip_high (DAPO clip-higher)")
    max_grad_norm: float = Field(1.0, gt=0)
    normalize_std: bool = Field(True, description="GRPO: divide advantages by the group's reward std")
    micro_batch: int = Field(16, ge=1, description="sequences per forward/backward pass")
    updates_per_batch: int = Field(1, ge=1, le=16, description="optimizer steps on each batch (PPO epochs)")
    threads: int | None = Field(None, ge=1, description="torch CPU threads for the trainer")
    seed: int = 0
