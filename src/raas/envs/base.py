"""Environments (task handlers): INIT, RUN and EVAL of one kind of task.

A handler names itself, validates an instance, prepares the episode (INIT: prompt, tools,
sandbox), runs it (RUN: most handlers reuse the standard agent loop) and scores it (EVAL).
Handlers register by name here, or from other packages through the ``raas.envs`` entry point.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

from raas.agent.chat import ChatRenderer
from raas.agent.loop import EpisodeResult, run_agent
from raas.agent.tools.base import Tool
from raas.contracts import AgentConfig, SamplingParams
from raas.contracts.protocols import InferenceClient


class TaskError(ValueError):
    """An instance that the handler cannot run; ``field`` names the offending instance field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"task.{field}: {message}")
        self.field = field


@dataclass
class Episode:
    """What INIT hands to RUN and EVAL."""

    task_id: str
    messages: list[dict[str, Any]]
    tools: list[Tool] = field(default_factory=list)
    describe_tools: bool = True  # False: the messages already teach the tools; don't add their schemas
    state: dict[str, Any] = field(default_factory=dict)  # handler-private (expected answer, sandbox ...)


@dataclass
class RunContext:
    """What RUN needs from the service: an inference client and how to sample."""

    client: InferenceClient
    renderer: ChatRenderer
    sampling: SamplingParams
    agent: AgentConfig
    max_model_len: int


class Env(ABC):
    name: ClassVar[str]
    description: ClassVar[str] = ""
    fields: ClassVar[dict[str, str]] = {}  # instance field -> meaning, for GET /v1/envs

    def validate(self, instance: dict[str, Any]) -> dict[str, Any]:
        """Check an instance before it is accepted (raise TaskError naming the field)."""
        return instance

    @abstractmethod
    async def init(self, instance: dict[str, Any]) -> Episode: ...

    async def run(self, episode: Episode, ctx: RunContext) -> EpisodeResult:
        return await run_agent(
            ctx.client, ctx.renderer, episode.messages, episode.tools, ctx.sampling, ctx.agent, ctx.max_model_len,
            describe_tools=episode.describe_tools,
        )

    @abstractmethod
    async def eval(self, episode: Episode, result: EpisodeResult) -> tuple[float, dict[str, Any]]: ...

    async def close(self, episode: Episode) -> None:
        """Release what INIT acquired (sandboxes, kernels). Always called, even after a failure."""
