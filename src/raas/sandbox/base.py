"""The Sandbox protocol: where agent tools run untrusted commands.

A sandbox is one episode's private machine: a writable workspace directory, processes that can
be started in it, and a lifetime that ends with ``close()``. The contract every implementation
keeps:

* ``exec`` never raises because of what the command did: a failing, crashing or hanging command
  comes back as an ``ExecResult`` (exit code, bounded output, ``timed_out``). It raises
  ``SandboxError`` only when the sandbox itself is unusable (not started, closed, dead).
* The process group of a command is killed when its timeout expires, and every process the
  sandbox started is gone after ``close()`` (for isolating kinds, whatever the command did).
* Output kept in memory is bounded (``max_output`` bytes per stream, head and tail kept) no
  matter how much a command prints.
* File access (``read_file`` / ``write_file``) is confined to the workspace and the scratch
  directory; symlinks are resolved inside the sandbox's view, so a link planted by the
  sandboxed code cannot make the host touch its own files.
* ``isolated`` says whether the implementation is a security boundary at all (``local`` is not).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Protocol, runtime_checkable

DEFAULT_MAX_OUTPUT = 1 << 20  # bytes kept per stream by exec


class HeadTail:
    """A byte sink that keeps the first and last ``limit // 2`` bytes of everything added.

    Memory stays below ``2 * limit`` however much is added; trimming is amortised (the tail is
    cut back only when it reaches twice its share), so adding N bytes costs O(N).
    """

    def __init__(self, limit: int):
        self.limit = limit
        self.total = 0
        self._head = bytearray()
        self._tail = bytearray()
        self._tail_cap = limit - limit // 2

    def add(self, data: bytes) -> None:
        self.total += len(data)
        room = self.limit // 2 - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        self._tail += data
        if len(self._tail) > 2 * self._tail_cap:
            del self._tail[: len(self._tail) - self._tail_cap]

    @property
    def dropped(self) -> int:
        return self.total - len(self._head) - min(len(self._tail), self._tail_cap)

    def parts(self) -> tuple[bytes, bytes]:
        """(head, tail); ``dropped`` bytes are missing between them."""
        return bytes(self._head), bytes(self._tail[-self._tail_cap :] if self._tail_cap else b"")

    def getvalue(self) -> bytes:
        head, tail = self.parts()
        return head + tail


class SandboxError(RuntimeError):
    """The sandbox cannot do what was asked: it failed to start, is closed or died, or a path is
    outside what it may touch. Never raised for a command's own failure."""


@dataclass(frozen=True)
class Limits:
    """Resource limits applied to everything that runs in a sandbox (``None`` = unlimited).

    ``cpu_seconds``, ``memory_bytes`` (address space), ``file_size_bytes`` and ``open_files`` are
    POSIX rlimits and so apply per process. ``max_processes`` is RLIMIT_NPROC, which Linux counts
    per user *and user namespace*: in a bubblewrap sandbox it caps the sandbox as a whole. Docker
    maps it to ``--pids-limit``. ``tmp_bytes`` sizes the private /tmp where the kind has one.
    ``timeout`` is the default wall clock of one ``exec``.
    """

    cpu_seconds: int | None = 600
    memory_bytes: int | None = 8 << 30
    max_processes: int | None = 256
    file_size_bytes: int | None = 1 << 30
    open_files: int | None = 4096
    tmp_bytes: int | None = 1 << 30
    timeout: float = 60.0

    def prlimit_args(self) -> list[str]:
        """The limits as util-linux ``prlimit`` options (soft = hard, so nothing can raise them)."""
        pairs = [
            ("cpu", self.cpu_seconds), ("as", self.memory_bytes), ("nproc", self.max_processes),
            ("fsize", self.file_size_bytes), ("nofile", self.open_files),
        ]
        return [f"--{name}={v}:{v}" for name, v in pairs if v is not None]

    def ulimit_command(self, processes: bool = True) -> str:
        """The limits as one bash ``ulimit`` command (soft and hard; sizes in KiB, rounded down)."""
        pairs = [
            ("-t", self.cpu_seconds), ("-v", self.memory_bytes and self.memory_bytes // 1024),
            ("-u", self.max_processes if processes else None),
            ("-f", self.file_size_bytes and self.file_size_bytes // 1024), ("-n", self.open_files),
        ]
        opts = [f"{flag} {v}" for flag, v in pairs if v is not None]
        return f"ulimit {' '.join(opts)}" if opts else ""


@dataclass
class ExecResult:
    exit_code: int  # 128 + N when killed by signal N (shell convention)
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    stdout_dropped: int = 0  # bytes cut from the middle of stdout to respect max_output
    stderr_dropped: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def text(self) -> str:
        """stdout then stderr, decoded leniently (for logs and tests)."""
        return (self.stdout + self.stderr).decode("utf-8", "replace")


@runtime_checkable
class SandboxProcess(Protocol):
    """A process started with ``Sandbox.spawn``: byte streams in and out, an exit code, a kill."""

    pty: bool

    async def read(self, n: int = 1 << 16) -> bytes:
        """Next chunk of stdout (stdout+stderr on a pty); b"" once the process is done with it."""
        ...

    async def read_stderr(self, n: int = 1 << 16) -> bytes: ...

    def write(self, data: bytes) -> None:
        """Queue bytes for the process's stdin (the terminal, for a pty)."""
        ...

    async def close_stdin(self) -> None: ...

    async def wait(self) -> int: ...

    async def kill(self) -> None:
        """SIGKILL the process's group. Idempotent."""
        ...

    @property
    def returncode(self) -> int | None: ...


@runtime_checkable
class Sandbox(Protocol):
    kind: str
    isolated: bool
    limits: Limits
    workspace: str  # absolute path of the workspace inside the sandbox (the default cwd)
    scratch: str  # absolute path (inside) of a writable directory for tool plumbing, not in the workspace

    async def start(self) -> None: ...

    async def exec(
        self,
        cmd: str | Sequence[str],
        *,
        timeout: float | None = None,
        stdin: bytes | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        max_output: int = DEFAULT_MAX_OUTPUT,
    ) -> ExecResult:
        """Run ``cmd`` (a string goes to ``/bin/sh -c``) to completion or timeout."""
        ...

    async def spawn(
        self, cmd: str | Sequence[str], *, pty: bool = False, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> SandboxProcess:
        """Start a long-lived process (a shell, a kernel); it dies at the latest with the sandbox."""
        ...

    async def read_file(self, path: str, *, max_bytes: int = 64 << 20) -> bytes: ...

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        """Create or replace a file (and its missing parent directories)."""
        ...

    def host_path(self, path: str) -> Path:
        """Where an inside path of the workspace or scratch directory lives on the host."""
        ...

    async def close(self) -> None: ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None: ...
