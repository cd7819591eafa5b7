"""The small interfaces at raas' boundaries. Implementations live in the parts that own them."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from raas.contracts.api import GenerateResponse, SamplingParams


@runtime_checkable
class InferenceClient(Protocol):
    """Token-in/token-out generation against some inference server (or a router over several)."""

    async def generate(self, prompt_token_ids: list[int], sampling: SamplingParams) -> GenerateResponse: ...
