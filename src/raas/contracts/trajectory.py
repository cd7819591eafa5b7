"""The Trajectory record: the one thing every part of raas passes around.

A trajectory is token-level. ``tokens`` holds the exact ids the model saw and produced, prompt
first; there is no prompt/completion split and nothing is ever re-tokenised. Per-token lists are
aligned with ``tokens``:

* ``loss_mask[i]`` is 1 where the policy sampled ``tokens[i]``, 0 for prompt, tool output and
  chat-template glue;
* ``logprobs[i]`` is the behaviour policy's log-probability of the sampled token (0.0 where the
  mask is 0);
* ``versions[i]`` is the policy version that sampled the token (-1 where the mask is 0).

The validators below enforce these invariants so a malformed record fails where it is built, not
three processes later inside a loss function.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Status(str, Enum):
    """How an episode ended."""

    completed = "completed"  # the agent finished (answered / called finish / stopped) and was scored
    truncated = "truncated"  # max turns, max total tokens or the context length ended it; still scored
    failed = "failed"  # an error in INIT, RUN or EVAL
    timeout = "timeout"  # the job's timeout_s elapsed
    cancelled = "cancelled"  # DELETE /v1/rollouts/{id} or service shutdown


class Stage(str, Enum):
    init = "init"
    run = "run"
    eval = "eval"


class ToolCall(BaseModel):
    """One tool call as parsed from the model's output."""

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class Turn(BaseModel):
    """Readable view of one message and the half-open token span [start, end) it occupies.

    For a turn the policy sampled (``sampled=True``) the span covers exactly the sampled tokens, so
    decoding ``tokens[start:end]`` gives back ``text``. For prompt messages (including few-shot
    assistant examples) and tool results it covers the rendered message with its template glue.
    """

    role: str
    text: str
    tool_calls: list[ToolCall] = Field(default_factory=list)
    span: tuple[int, int] = (0, 0)
    sampled: bool = False


class Timing(BaseModel):
    """Wall-clock seconds spent per stage."""

    queued_s: float = 0.0
    init_s: float = 0.0
    run_s: float = 0.0
    eval_s: float = 0.0


class TrajectoryError(BaseModel):
    stage: str
    type: str
    message: str


class Trajectory(BaseModel):
    model_config = ConfigDict(use_enum_values=False)

    id: str
    group_id: str
    task_id: str
    env: str
    tokens: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    logprobs: list[float] = Field(default_factory=list)
    versions: list[int] = Field(default_factory=list)
    reward: float = 0.0
    metrics: dict[str, Any] = Field(default_factory=dict)
    status: Status = Status.completed
    turns: list[Turn] = Field(default_factory=list)
    timing: Timing = Field(default_factory=Timing)
    error: TrajectoryError | None = None

    @model_validator(mode="after")
    def _check_invariants(self) -> Trajectory:
        n = len(self.tokens)
        for name in ("loss_mask", "logprobs", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"{name} has {len(getattr(self, name))} entries but tokens has {n}; "
                    "all per-token lists must have equal length"
                )
        for i, (m, lp, v) in enumerate(zip(self.loss_mask, self.logprobs, self.versions)):
            if m not in (0, 1):
                raise ValueError(f"loss_mask[{i}] is {m}; it must be 0 or 1")
            if m == 0 and (lp != 0.0 or v != -1):
                raise ValueError(f"token {i} is not sampled (loss_mask 0) but has logprob {lp} / version {v}")
            if m == 1 and (v < 0 or lp > 0.0):
                raise ValueError(f"token {i} is sampled but has version {v} / logprob {lp}")
        for j, turn in enumerate(self.turns):
            a, b = turn.span
            if not 0 <= a <= b <= n:
                raise ValueError(f"turns[{j}].span {turn.span} lies outside tokens [0, {n})")
            if turn.sampled and not all(self.loss_mask[a:b]):
                raise ValueError(f"turns[{j}] is sampled but its span {turn.span} covers unsampled tokens")
        if self.status in (Status.failed, Status.timeout, Status.cancelled) and self.error is None:
            raise ValueError(f"status {self.status.value} needs an error")
        return self

    # Convenience views used by the trainer and coordinator.
    @property
    def num_sampled(self) -> int:
        return sum(self.loss_mask)

    @property
    def sampled_versions(self) -> list[int]:
        return [v for v, m in zip(self.versions, self.loss_mask) if m]

    @property
    def min_version(self) -> int:
        """Oldest policy version that produced a token here (-1 if none was sampled)."""
        vs = self.sampled_versions
        return min(vs) if vs else -1
