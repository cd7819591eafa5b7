"""Request and response models of raas' HTTP APIs, shared by servers and clients.

Two APIs live here: the rollout service (``/v1/rollouts``, ``/v1/results`` ...) and the inference
contract that the rollout service speaks to an inference server (``/v1/generate``,
``/v1/weights``). Both the FastAPI apps and the httpx clients import these models, so a field is
spelled in exactly one place.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from raas.contracts.trajectory import Trajectory

API_VERSION = "v1"


# --------------------------------------------------------------------------- sampling / agent
class SamplingParams(BaseModel):
    """How to sample one model turn. Used by both the rollout API and the inference contract."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, ge=0.0, le=10.0, description="0 means greedy decoding")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="nucleus sampling mass")
    top_k: int = Field(0, ge=0, description="keep the k most likely tokens; 0 disables")
    max_tokens: int = Field(256, ge=1, le=65536, description="most tokens sampled in one turn")
    stop_token_ids: list[int] = Field(default_factory=list, description="extra ids that end a turn")
    seed: int | None = Field(None, description="per-request seed for reproducible sampling")


class AgentConfig(BaseModel):
    """Limits of the standard multi-turn agent loop."""

    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(6, ge=1, le=1000, description="most assistant turns in an episode")
    max_total_tokens: int | None = Field(
        None, ge=1, description="cap on the whole episode's tokens (prompt included); None = model context"
    )
    max_tool_output_chars: int = Field(4000, ge=64, description="tool results longer than this are truncated")


class TaskSpec(BaseModel):
    """An environment instance: ``env`` picks the handler, every other field is the instance."""

    model_config = ConfigDict(extra="allow")

    env: str = Field(..., min_length=1, description="registered environment name, see GET /v1/envs")

    def instance(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


# --------------------------------------------------------------------------- rollout service
class RolloutRequest(BaseModel):
    """Body of ``POST /v1/rollouts``: one task, sampled ``n`` times as one group."""

    model_config = ConfigDict(extra="forbid")

    task: TaskSpec
    n: int = Field(1, ge=1, le=1024, description="samples of this task, forming one group")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    timeout_s: float | None = Field(None, gt=0.0, description="wall-clock limit per sample, all stages")
    priority: int = Field(0, description="higher runs first within a stage queue")
    client_id: str | None = Field(
        None, min_length=1, max_length=256, description="resubmitting with the same id returns the same jobs"
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="echoed into each trajectory's metrics")


class SubmitResponse(BaseModel):
    group_id: str
    ids: list[str]
    duplicate: bool = Field(False, description="true when client_id matched an earlier submit")


class JobState(str, Enum):
    queued = "queued"
    init = "init"
    run = "run"
    eval = "eval"
    done = "done"


class RolloutStatus(BaseModel):
    """Body of ``GET /v1/rollouts/{id}`` and one entry of ``GET /v1/results``."""

    id: str
    group_id: str
    client_id: str | None = None
    status: JobState
    trajectory: Trajectory | None = None


class ResultsPage(BaseModel):
    """Finished jobs in completion order; pass ``cursor`` as ``after`` to get the next page."""

    results: list[RolloutStatus]
    cursor: int


class EnvInfo(BaseModel):
    name: str
    description: str
    fields: dict[str, str] = Field(default_factory=dict, description="instance field -> meaning")


class EnvList(BaseModel):
    envs: list[EnvInfo]


class LLMServer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: str = Field(..., min_length=1, description="base URL of an inference server")

    @field_validator("url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("url must start with http:// or https://")
        return v.rstrip("/")


class LLMServerList(BaseModel):
    servers: list[LLMServer]


class PolicyAnnouncement(BaseModel):
    """Body of ``POST /v1/policy``: a new policy version is (about to be) live."""

    model_config = ConfigDict(extra="forbid")

    version: int = Field(..., ge=0)


class ServiceHealth(BaseModel):
    status: Literal["ok", "degraded"] = "ok"
    version: str
    policy_version: int
    llm_servers: list[str]
    queued: int
    running: dict[str, int]
    done: int


# --------------------------------------------------------------------------- inference contract
class GenerateRequest(BaseModel):
    """Token-in/token-out generation: ``POST /v1/generate`` on the embedded engine."""

    model_config = ConfigDict(extra="forbid")

    prompt_token_ids: list[int] = Field(..., min_length=1)
    sampling: SamplingParams = Field(default_factory=SamplingParams)


FinishReason = Literal["stop", "length", "abort"]


class GenerateResponse(BaseModel):
    output_token_ids: list[int]
    logprobs: list[float] = Field(description="log-probability of each output token under the policy")
    version: int = Field(description="policy version whose weights produced every output token")
    finish_reason: FinishReason


class WeightUpdateRequest(BaseModel):
    """Body of ``POST /v1/weights``: load new weights from a safetensors file the server can read.

    ``format="full"`` holds parameters by the model's own names (any subset); ``format="lora"``
    holds ``<module>.lora_A`` / ``<module>.lora_B`` pairs that are merged onto the base weights as
    ``W = W_base + scale * B @ A``.
    """

    model_config = ConfigDict(extra="forbid")

    path: str = Field(..., min_length=1)
    format: Literal["full", "lora"] = "full"
    lora_scale: float = 1.0
    version: int | None = Field(None, ge=0, description="new policy version; default current + 1")


class WeightUpdateResponse(BaseModel):
    version: int
    tensors: int
    seconds: float


class EngineInfo(BaseModel):
    model: str
    version: int
    device: str
    max_model_len: int
    eos_token_ids: list[int]
