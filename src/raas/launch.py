"""Start raas processes (engine, service) as children and wait until they answer."""

from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: get SIGTERM when the parent dies (Linux), so no orphan survives
    a killed coordinator."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


class _Child:
    def __init__(self, argv: list[str], port: int, log_path: str | Path | None, env: dict | None = None):
        self.argv, self.port, self.log_path, self.env = argv, port, log_path, env
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 300.0):
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        env = {**os.environ, **(self.env or {})}
        self.proc = subprocess.Popen(
            self.argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, preexec_fn=_die_with_parent
        )
        try:
            asyncio.run(wait_healthy(self.url, timeout_s, self.proc))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class EngineProcess(_Child):
    def __init__(self, model_dir, *, port: int | None = None, threads: int | None = None, log_path=None, max_batch: int = 64):
        port = port or free_port()
        argv = [sys.executable, "-m", "raas.cli", "engine", "--model", str(model_dir), "--port", str(port),
                "--max-batch", str(max_batch)]
        if threads:
            argv += ["--threads", str(threads)]
        super().__init__(argv, port, log_path)


class ServiceProcess(_Child):
    def __init__(self, model_dir, llm_urls: list[str], *, port: int | None = None, state_dir=None, log_path=None,
                 run_workers: int = 64, max_model_len: int = 8192):
        port = port or free_port()
        argv = [sys.executable, "-m", "raas.cli", "serve", "--model", str(model_dir), "--port", str(port),
                "--run-workers", str(run_workers), "--max-model-len", str(max_model_len)]
        for u in llm_urls:
            argv += ["--llm", u]
        if state_dir:
            argv += ["--state-dir", str(state_dir)]
        super().__init__(argv, port, log_path)


async def wait_healthy(url: str, timeout_s: float = 300.0, proc=None) -> None:
    """Wait until ``url``/health answers 200 (or the process ``proc`` dies)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with httpx.AsyncClient(timeout=2.0) as http:
        while True:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the server process for {url} exited with code {proc.returncode}")
            try:
                if (await http.get(f"{url}/health")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"{url} did not become healthy within {timeout_s:.0f} s")
            await asyncio.sleep(0.2)
