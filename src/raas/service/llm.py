"""Inference clients: one generic HTTP client per server, and a router over several.

The rollout service never talks to a model directly: it calls ``InferenceClient.generate`` with
token ids. ``EngineClient`` speaks the embedded engine's native ``/v1/generate``. ``Router``
spreads calls over the registered servers by load (fewest requests in flight) with session
affinity (an episode's later turns go to the server that holds its prefix in cache), and moves a
call to another server when one fails to answer.
"""

from __future__ import annotations

import hashlib
import logging

import httpx

from raas.contracts import GenerateRequest, GenerateResponse, SamplingParams

log = logging.getLogger(__name__)


class InferenceError(RuntimeError):
    pass


class EngineClient:
    """Token-in/token-out over HTTP to a server with the engine contract (``POST /v1/generate``)."""

    def __init__(self, url: str, timeout_s: float = 600.0, http: httpx.AsyncClient | None = None):
        self.url = url.rstrip("/")
        self._http = http or httpx.AsyncClient(timeout=timeout_s, limits=httpx.Limits(max_connections=512))
        self.in_flight = 0

    async def generate(self, prompt_token_ids: list[int], sampling: SamplingParams) -> GenerateResponse:
        body = GenerateRequest(prompt_token_ids=prompt_token_ids, sampling=sampling).model_dump()
        self.in_flight += 1
        try:
            r = await self._http.post(f"{self.url}/v1/generate", json=body)
        finally:
            self.in_flight -= 1
        if r.status_code != 200:
            raise InferenceError(f"{self.url} answered {r.status_code}: {r.text[:300]}")
        return GenerateResponse.model_validate(r.json())

    async def aclose(self) -> None:
        await self._http.aclose()


class Router:
    """Least-loaded routing with session affinity over a changeable set of servers."""

    def __init__(self, urls: list[str] | None = None):
        self._clients: dict[str, EngineClient] = {}
        self._affinity: dict[str, str] = {}
        for u in urls or []:
            self.add(u)

    @property
    def urls(self) -> list[str]:
        return list(self._clients)

    def add(self, url: str) -> None:
        url = url.rstrip("/")
        if url not in self._clients:
            self._clients[url] = EngineClient(url)

    async def remove(self, url: str) -> bool:
        c = self._clients.pop(url.rstrip("/"), None)
        if c is not None:
            await c.aclose()
        self._affinity = {k: v for k, v in self._affinity.items() if v in self._clients}
        return c is not None

    def pick(self, session: str | None = None, exclude: set[str] = frozenset()) -> EngineClient:
        live = [u for u in self._clients if u not in exclude]
        if not live:
            raise InferenceError("no inference server is registered (POST /v1/llm/servers)")
        if session and self._affinity.get(session) in live:
            u = self._affinity[session]
            # Stay for the cache unless that server is clearly busier than the least loaded one.
            least = min(self._clients[x].in_flight for x in live)
            if self._clients[u].in_flight <= least + 4:
                return self._clients[u]
        # Least loaded; ties broken by a stable hash so sessions spread evenly.
        u = min(live, key=lambda x: (self._clients[x].in_flight, _stable_hash(f"{session}|{x}")))
        if session:
            self._affinity[session] = u
        return self._clients[u]

    def forget(self, session: str) -> None:
        self._affinity.pop(session, None)

    def session(self, key: str) -> SessionClient:
        return SessionClient(self, key)

    async def generate(
        self, prompt_token_ids: list[int], sampling: SamplingParams, session: str | None = None
    ) -> GenerateResponse:
        tried: set[str] = set()
        last: Exception | None = None
        for _ in range(max(1, len(self._clients))):
            client = self.pick(session, tried)
            try:
                return await client.generate(prompt_token_ids, sampling)
            except (httpx.TransportError, InferenceError) as e:
                if isinstance(e, InferenceError) and "answered 4" in str(e):
                    raise  # a bad request fails the same everywhere
                log.warning("inference server %s failed (%s); trying another", client.url, e)
                tried.add(client.url)
                last = e
                if session:
                    self.forget(session)
        raise InferenceError(f"every inference server failed; last error: {last}")

    async def aclose(self) -> None:
        for c in list(self._clients.values()):
            await c.aclose()
        self._clients.clear()


def _stable_hash(text: str) -> int:
    return int(hashlib.blake2b(text.encode(), digest_size=4).hexdigest(), 16)


class SessionClient:
    """An ``InferenceClient`` bound to one episode, so the router keeps its turns together."""

    def __init__(self, router: Router, key: str):
        self.router, self.key = router, key

    async def generate(self, prompt_token_ids: list[int], sampling: SamplingParams) -> GenerateResponse:
        return await self.router.generate(prompt_token_ids, sampling, session=self.key)
