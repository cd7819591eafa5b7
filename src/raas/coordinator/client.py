"""HTTP clients the coordinator uses: the rollout service and the engines' weight endpoint.
Request and response bodies are the shared models of ``raas.contracts``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx

from raas.contracts import (
    LLMServerList,
    PolicyAnnouncement,
    ResultsPage,
    RolloutRequest,
    RolloutStatus,
    SubmitResponse,
    WeightUpdateRequest,
    WeightUpdateResponse,
)


class ServiceClient:
    def __init__(self, url: str, timeout_s: float = 120.0):
        self.url = url.rstrip("/")
        self.http = httpx.AsyncClient(base_url=self.url, timeout=timeout_s)

    async def submit(self, req: RolloutRequest) -> SubmitResponse:
        for attempt in range(5):  # a retried submit with the same client_id is idempotent
            try:
                r = await self.http.post("/v1/rollouts", json=req.model_dump(mode="json", exclude_none=True))
                break
            except httpx.TransportError:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.5 * 2**attempt)
        if r.status_code != 202:
            raise RuntimeError(f"the rollout service refused a job ({r.status_code}): {r.text[:500]}")
        return SubmitResponse.model_validate(r.json())

    async def results(self, after: int = 0, wait_s: float = 10.0) -> AsyncIterator[RolloutStatus]:
        """Every finished job from cursor ``after`` on, forever (long-polls the service)."""
        cursor = after
        while True:
            r = await self.http.get("/v1/results", params={"after": cursor, "wait_s": wait_s}, timeout=wait_s + 30)
            r.raise_for_status()
            page = ResultsPage.model_validate(r.json())
            cursor = page.cursor
            for item in page.results:
                yield item

    async def llm_servers(self) -> list[str]:
        r = await self.http.get("/v1/llm/servers")
        r.raise_for_status()
        return [s.url for s in LLMServerList.model_validate(r.json()).servers]

    async def announce(self, version: int) -> None:
        r = await self.http.post("/v1/policy", json=PolicyAnnouncement(version=version).model_dump())
        r.raise_for_status()

    async def aclose(self) -> None:
        await self.http.aclose()


async def publish_weights(engine_urls: list[str], req: WeightUpdateRequest, timeout_s: float = 300.0) -> list[WeightUpdateResponse]:
    """Load new weights on every engine; all of them must accept."""
    async with httpx.AsyncClient(timeout=timeout_s) as http:
        rs = await asyncio.gather(*(http.post(f"{u.rstrip('/')}/v1/weights", json=req.model_dump()) for u in engine_urls))
    out = []
    for u, r in zip(engine_urls, rs):
        if r.status_code != 200:
            raise RuntimeError(f"engine {u} refused the weight update ({r.status_code}): {r.text[:500]}")
        out.append(WeightUpdateResponse.model_validate(r.json()))
    return out
