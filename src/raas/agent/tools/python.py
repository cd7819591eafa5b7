"""The ``python`` tool: a persistent Jupyter kernel (ipykernel) running inside a sandbox.

The kernel is a sandboxed process like any command, and the host reaches it the way
jupyter_client always does, over ZeroMQ, but with ``transport="ipc"``: Unix sockets created by
the kernel in the sandbox's scratch directory, a bind mount shared with the host. (TCP would
not cross the sandbox's network namespace; Unix sockets in a shared directory do.)

That directory is writable by the sandboxed code, which could swap a socket for a symlink to a
host socket and have the host connect there as itself. So once the kernel has bound its five
sockets, the host opens each with ``O_PATH | O_NOFOLLOW``, checks that it is a socket, and
connects through ``/proc/self/fd/N`` (reached via a host-private directory of symlinks, since
jupyter_client names ipc endpoints ``<ip>-<port>``): the connection is pinned to the inode the
kernel created, whatever happens to the path later.

A call executes the code, collects stream output, results (``text/plain``; other MIME types
are named) and tracebacks (ANSI colours removed) until the kernel goes idle. On timeout the
kernel gets an ``interrupt_request`` (SIGINT: KeyboardInterrupt in the code); if it does not
come back within the grace period it is killed and the next call starts a fresh kernel (the
result says the state is lost). State (variables, imports) persists otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import re
import secrets
import shutil
import stat
import sys
import tempfile
from collections.abc import Awaitable, Callable
from typing import Any

from raas.agent.tools.base import ToolResult
from raas.sandbox.base import HeadTail, Sandbox, SandboxError, SandboxProcess

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
_ENV = {"MPLBACKEND": "Agg", "PYTHONDONTWRITEBYTECODE": "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}


class _KernelDied(Exception):
    pass


class PythonTool:
    name = "python"
    description = (
        "Execute Python code in a persistent Jupyter kernel inside the sandbox. Variables, imports and "
        "definitions persist between calls. Returns printed output, the value of the last expression and "
        "any traceback. The working directory is the workspace."
    )
    parameters = {
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "Python code to execute"},
            "timeout": {"type": "number", "description": "seconds before execution is interrupted (default 30)"},
        },
        "required": ["code"],
    }

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        python: str | None = None,
        timeout: float = 30.0,
        max_timeout: float = 600.0,
        max_output_chars: int = 10_000,
        interrupt_grace: float = 3.0,
        startup_timeout: float = 60.0,
    ):
        """``python``: the interpreter inside the sandbox (default: the host's, which the
        bubblewrap sandbox binds read-only); it needs ipykernel."""
        self.sandbox = sandbox
        self.python = python or sys.executable
        self.timeout, self.max_timeout = timeout, max_timeout
        self.max_output_chars = max_output_chars
        self.interrupt_grace = interrupt_grace
        self.startup_timeout = startup_timeout
        self._proc: SandboxProcess | None = None
        self._client: Any = None
        self._fds: list[int] = []
        self._links: str | None = None
        self._log = HeadTail(8192)  # the kernel's own stdout/stderr, for startup failures
        self._drains: list[asyncio.Future[None]] = []
        self._lock = asyncio.Lock()

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str):
            return ToolResult("Error: python needs a string argument 'code'", ok=False)
        timeout = arguments.get("timeout", self.timeout)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            return ToolResult("Error: 'timeout' must be a positive number of seconds", ok=False)
        async with self._lock:
            try:
                if self._client is None:
                    await self._start()
                return await self._execute(code, min(float(timeout), self.max_timeout))
            except (SandboxError, _KernelDied) as e:
                await self._stop()
                return ToolResult(f"Error: the Python kernel is unavailable: {e}", ok=False)

    async def close(self) -> None:
        async with self._lock:
            await self._stop()

    # -- kernel lifecycle ----------------------------------------------------------------------
    async def _start(self) -> None:
        from jupyter_client.asynchronous.client import AsyncKernelClient

        kid = secrets.token_hex(4)
        prefix = f"{self.sandbox.scratch}/k{kid}"
        info: dict[str, Any] = {
            "transport": "ipc", "ip": prefix, "key": secrets.token_hex(16), "signature_scheme": "hmac-sha256",
            **{f"{ch}_port": i + 1 for i, ch in enumerate(_CHANNELS)},
        }
        conn = f"{self.sandbox.scratch}/kernel-{kid}.json"
        await self.sandbox.write_file(conn, json.dumps(info).encode(), mode=0o600)
        env = {**_ENV, "IPYTHONDIR": f"{self.sandbox.scratch}/ipython"}
        argv = [self.python, "-m", "ipykernel_launcher", "-f", conn, "--HistoryManager.enabled=False"]
        self._log = HeadTail(8192)
        self._proc = proc = await self.sandbox.spawn(argv, env=env)
        self._drains = [asyncio.ensure_future(_drain(proc.read, self._log)),
                        asyncio.ensure_future(_drain(proc.read_stderr, self._log))]
        await self._pin_sockets(prefix, info)
        client = AsyncKernelClient()
        client.load_connection_info({**info, "ip": f"{self._links}/k"})  # type: ignore[typeddict-item]
        client.start_channels(stdin=False, hb=False)
        self._client = client
        ready = asyncio.ensure_future(client.wait_for_ready(timeout=self.startup_timeout))
        died = asyncio.ensure_future(proc.wait())
        await asyncio.wait({ready, died}, return_when=asyncio.FIRST_COMPLETED)
        if not ready.done():
            ready.cancel()
            raise _KernelDied(f"it exited during startup: {self._tail()}")
        died.cancel()
        try:
            ready.result()
        except RuntimeError as e:
            raise _KernelDied(f"{e}: {self._tail()}") from None

    async def _pin_sockets(self, prefix: str, info: dict[str, Any]) -> None:
        """Wait for the kernel's sockets, then pin each (see the module docstring)."""
        assert self._proc is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.startup_timeout
        paths = [self.sandbox.host_path(f"{prefix}-{info[f'{ch}_port']}") for ch in _CHANNELS]
        while not all(p.exists() for p in paths):
            if self._proc.returncode is not None:
                raise _KernelDied(f"it exited during startup: {self._tail()}")
            if loop.time() > deadline:
                raise _KernelDied(f"no sockets after {self.startup_timeout:g}s: {self._tail()}")
            await asyncio.sleep(0.02)  # startup only: a kernel takes a second or more to import
        self._links = tempfile.mkdtemp(prefix="raas-kernel-")
        for ch, path in zip(_CHANNELS, paths, strict=True):
            fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
            self._fds.append(fd)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                raise _KernelDied(f"{path.name} is not a socket")
            os.symlink(f"/proc/self/fd/{fd}", f"{self._links}/k-{info[f'{ch}_port']}")

    async def _stop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.stop_channels()
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(SandboxError):
                await proc.kill()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        if self._links:
            shutil.rmtree(self._links, ignore_errors=True)
            self._links = None

    def _tail(self) -> str:
        return self._log.getvalue().decode("utf-8", "replace").strip()[-2000:] or "(no output)"

    # -- one execution -------------------------------------------------------------------------
    async def _execute(self, code: str, timeout: float) -> ToolResult:
        assert self._proc is not None
        client = self._client
        msg_id = client.execute(code, allow_stdin=False, stop_on_error=False)
        out = HeadTail(4 * self.max_output_chars)
        state = {"error": False}
        collect = asyncio.ensure_future(self._collect(msg_id, out, state))
        died = asyncio.ensure_future(self._proc.wait())
        try:
            done, _ = await asyncio.wait({collect, died}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            note = ""
            if not done:
                note = f"[timed out after {timeout:g}s; interrupted]"
                client.control_channel.send(client.session.msg("interrupt_request", {}))
                done, _ = await asyncio.wait({collect, died}, timeout=self.interrupt_grace, return_when=asyncio.FIRST_COMPLETED)
                if not done:
                    await self._stop()
                    return ToolResult(self._format(out, f"[timed out after {timeout:g}s; the kernel did not respond to "
                                                         "the interrupt and was restarted: all state is lost]"), ok=False)
            if collect not in done:
                code_ = self._proc.returncode
                await self._stop()
                return ToolResult(self._format(out, f"[the kernel died (exit code {code_}); the next call starts a "
                                                    "new one: all state is lost]"), ok=False)
            return ToolResult(self._format(out, note), ok=not (note or state["error"]))
        finally:
            collect.cancel()
            died.cancel()

    async def _collect(self, msg_id: str, out: HeadTail, state: dict[str, bool]) -> None:
        """IOPub output of ``msg_id`` until the kernel is idle again."""
        while True:
            try:
                msg = await self._client.get_iopub_msg(timeout=3600)
            except queue.Empty:
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "status" and content.get("execution_state") == "idle":
                return
            if kind == "stream":
                out.add(content["text"].encode())
            elif kind in ("execute_result", "display_data"):
                out.add(_render(content.get("data", {})).encode())
            elif kind == "error":
                state["error"] = True
                out.add(("\n".join(content.get("traceback") or [f"{content['ename']}: {content['evalue']}"]) + "\n").encode())

    def _format(self, out: HeadTail, note: str) -> str:
        head, tail = out.parts()
        half = self.max_output_chars // 2
        text = _ANSI.sub("", head.decode("utf-8", "replace"))
        end = _ANSI.sub("", tail.decode("utf-8", "replace"))
        if out.dropped or len(text) + len(end) > self.max_output_chars:
            cut = out.dropped + max(0, len(text) - half) + max(0, len(end) - half)
            text = f"{text[:half]}\n[... {cut} characters cut ...]\n{end[-half:] if half else ''}"
        else:
            text += end
        text = "\n".join(p for p in (text.rstrip("\n"), note) if p)
        return text or "[no output]"


def _render(data: dict[str, Any]) -> str:
    text = data.get("text/plain")
    others = [k for k in data if k != "text/plain"]
    parts = ([text] if text else []) + ([f"[{', '.join(others)} output not shown]"] if others and not text else [])
    return "\n".join(parts) + "\n"


async def _drain(read: Callable[[], Awaitable[bytes]], sink: HeadTail) -> None:
    with contextlib.suppress(SandboxError, OSError):
        while chunk := await read():
            sink.add(chunk)
