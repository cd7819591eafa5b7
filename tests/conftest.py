"""Shared fixtures: a tiny real model, a real engine process, a real rollout service over HTTP."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from raas import models
from raas.launch import EngineProcess, free_port

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """A 2-layer random Llama with SmolLM2's real tokenizer and chat template (built once)."""
    return models.tiny(models.cache_dir() / "test-models" / "tiny-v1")


@pytest.fixture(scope="session")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.fixture(scope="session")
def engine(tiny_model, tmp_path_factory):
    """The real embedded engine serving the tiny model, as its own process."""
    log = tmp_path_factory.mktemp("engine") / "engine.log"
    with EngineProcess(tiny_model, threads=1, log_path=log) as proc:
        yield proc


class ServerThread:
    """Run an ASGI app with uvicorn on a free port in a thread (real HTTP, lifespan included)."""

    def __init__(self, app):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture
def make_service(tokenizer, engine):
    """Factory: start a rollout service (real app, real HTTP) against the tiny engine."""
    from raas.service.app import create_app

    started = []

    def make(**kw):
        kw.setdefault("max_model_len", 4096)
        app = create_app(tokenizer, kw.pop("llm_urls", [engine.url]), **kw)
        srv = ServerThread(app).__enter__()
        started.append(srv)
        return srv

    yield make
    for s in started:
        s.__exit__(None, None, None)


def wait_done(client: httpx.Client, job_id: str, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        r = client.get(f"/v1/rollouts/{job_id}").json()
        if r["status"] == "done":
            return r
        time.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish in {timeout_s} s")


def run(coro):
    return asyncio.run(coro)
