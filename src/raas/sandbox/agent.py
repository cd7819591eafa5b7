"""The machinery shared by every sandbox kind: a tiny shell agent inside, FIFOs across.

Each sandbox runs one long-lived shell (``AGENT`` below) as its first process. The host
talks to it over two pipes: requests (``run ID`` / ``kill PGID``) on its stdin, replies
(``ready``, ``pid ID PGID``, ``exit ID CODE``, ``killed PGID``) on its stdout. A command is
described by a wrapper script the host writes into the control directory, which the sandbox
sees read-only: the wrapper opens the command's stdin/stdout/stderr FIFOs (made by the host in
the same directory), reports its process group and later the exit status. Because data flows
through FIFOs on shared directories, the same host code drives bubblewrap, Apptainer, Docker
and plain local processes; a kind only says how to launch the agent.

Why a shell and not a Python agent: a shell starts in a few milliseconds where Python takes
tens, and that is what makes a fresh sandbox per episode cheap. What it needs inside: bash, or
a POSIX ``/bin/sh`` plus util-linux ``setsid``; ``script`` (util-linux) for ptys.

Invariants:

* Every command runs as leader of its own process group, so the host can kill its whole tree
  with one ``kill -KILL -PGID`` (what timeouts do).
* The control directory is read-only inside and only the host creates files in it, so the
  host never opens a path the sandboxed code planted; replies are parsed strictly and a forged
  one can only confuse this sandbox's own bookkeeping.
* Output is read from non-blocking FIFOs with a bounded buffer per stream (reading pauses at
  ``_Stream.HIGH`` until the consumer catches up); ``exec`` keeps head and tail only.
* A command's output ends when it exits (``exit`` reply), not at EOF: a background child that
  inherited the FIFO must not make the host wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import posixpath
import re
import shlex
import shutil
import stat
import tempfile
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

from raas.sandbox.base import DEFAULT_MAX_OUTPUT, ExecResult, HeadTail, Limits, SandboxError
from raas.sandbox.fs import ConfinedFS

log = logging.getLogger(__name__)

# $1 is the control directory; fd 3 carries replies and the agent's own stdout goes nowhere.
# Under bash, job control (set -m) gives each "run" subshell a process group of its own, so a
# command costs one fork and no exec; a plain sh needs util-linux setsid (an exec) for that.
AGENT = r"""exec 3>&1 1>/dev/null
if [ -n "$BASH_VERSION" ]; then set -m; fi
echo ready >&3
while read -r op arg; do
  case $op in
    run) if [ -n "$BASH_VERSION" ]; then . "$1/$arg.sh" & else setsid -f /bin/sh "$1/$arg.sh" </dev/null; fi ;;
    kill) kill -s KILL -- "-$arg" 2>/dev/null; echo "killed $arg" >&3 ;;
  esac
done
"""

KILLED = 128 + 9  # exit code reported for a process killed by the host (shell convention)
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REPLY = re.compile(rb"(pid|exit|killed) (\d{1,10})(?: (\d{1,10}))?\n")


class _Stream:
    """Non-blocking reader of one FIFO with a bounded buffer, ended on demand by ``finish``."""

    HIGH = 1 << 20  # stop reading from the FIFO while this much is buffered

    def __init__(self, fd: int):
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._buf = bytearray()
        self._eof = False
        self._reading = False
        self._waiter: asyncio.Future[None] | None = None
        self._resume()

    async def read(self, n: int) -> bytes:
        while not self._buf and not self._eof:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        data = bytes(self._buf[:n])
        del self._buf[:n]
        if len(self._buf) < self.HIGH:
            self._resume()
        return data

    def finish(self) -> None:
        """The writer is done: take what the FIFO holds now, then report EOF after it."""
        while not self._eof and self._read_once():
            pass
        self._close()

    def _resume(self) -> None:
        if not self._reading and not self._eof:
            self._loop.add_reader(self._fd, self._on_readable)
            self._reading = True

    def _on_readable(self) -> None:
        self._read_once()
        if len(self._buf) >= self.HIGH and self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False

    def _read_once(self) -> bool:
        try:
            data = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return False
        except OSError:  # EIO on a hung-up pty and the like: the stream is over
            data = b""
        if data:
            self._buf += data
        else:
            self._close()
        self._wake()
        return bool(data)

    def _close(self) -> None:
        if not self._eof:
            self._eof = True
            if self._reading:
                self._loop.remove_reader(self._fd)
                self._reading = False
            os.close(self._fd)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class _Writer:
    """Queued non-blocking writes to a FIFO the host holds open read-write (so it never blocks)."""

    def __init__(self, fd: int):
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._pending = bytearray()
        self._closing = False
        self._watching = False

    def write(self, data: bytes) -> None:
        if self._fd < 0 or self._closing:
            raise SandboxError("stdin of this process is closed")
        self._pending += data
        self._flush()

    def close(self) -> None:
        self._closing = True
        self._flush()

    def abort(self) -> None:
        self._pending.clear()
        self._closing = True
        self._flush()

    def _flush(self) -> None:
        while self._pending and self._fd >= 0:
            try:
                del self._pending[: os.write(self._fd, self._pending)]
            except BlockingIOError:
                if not self._watching:
                    self._loop.add_writer(self._fd, self._flush)
                    self._watching = True
                return
        if self._watching:
            self._loop.remove_writer(self._fd)
            self._watching = False
        if self._closing and self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class AgentProcess:
    """A process started through the agent (implements ``SandboxProcess``)."""

    def __init__(self, box: AgentSandbox, pid: int, pty: bool, out: int, err: int | None, inp: int | None):
        self.id = pid
        self.pty = pty
        self._box = box
        self._out = _Stream(out)
        self._err = _Stream(err) if err is not None else None
        self._in = _Writer(inp) if inp is not None else None
        loop = asyncio.get_running_loop()
        self.pgid: asyncio.Future[int] = loop.create_future()
        self._exit: asyncio.Future[int] = loop.create_future()

    async def read(self, n: int = 1 << 16) -> bytes:
        return await self._out.read(n)

    async def read_stderr(self, n: int = 1 << 16) -> bytes:
        return await self._err.read(n) if self._err else b""

    def write(self, data: bytes) -> None:
        if self._in is None:
            raise SandboxError("this process has no stdin")
        self._in.write(data)

    async def close_stdin(self) -> None:
        if self._in is not None:
            # The wrapper opens the FIFO before it reports its pid; closing earlier would leave
            # it blocked in open() with no writer.
            with contextlib.suppress(TimeoutError, SandboxError):
                await asyncio.wait_for(asyncio.shield(self.pgid), 10)
            self._in.close()

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)

    async def kill(self) -> None:
        await self._box._kill(self)

    @property
    def returncode(self) -> int | None:
        return self._exit.result() if self._exit.done() else None

    def _exited(self, code: int) -> None:
        if self._exit.done():
            return
        self._exit.set_result(code)
        if not self.pgid.done():
            self.pgid.set_exception(SandboxError("process ended before it started"))
            self.pgid.exception()  # retrieved: nobody may be waiting for it
        self._out.finish()
        if self._err:
            self._err.finish()
        if self._in:
            self._in.abort()


class AgentSandbox:
    """Base of all kinds: subclasses implement ``_launch`` (and may refine ``_terminate``).

    Host layout, one temporary directory ``T`` per sandbox; inside paths mirror it (``/x`` is
    ``T/x``) for kinds that mount it, and equal the host paths for the local kind:

    * ``T/workspace`` -> ``/workspace``            read-write, the commands' cwd
    * ``T/run/raas/ctl`` -> ``/run/raas/ctl``      read-only inside: wrappers and FIFOs
    * ``T/run/raas/scratch`` -> ``/run/raas/scratch``  read-write: tool plumbing (sockets, files)
    """

    kind: ClassVar[str] = "agent"
    isolated: ClassVar[bool] = True
    mirror: ClassVar[bool] = True  # inside paths are T-relative (False: inside path == host path)
    start_timeout: float = 30.0

    def __init__(self, *, limits: Limits | None = None, env: Mapping[str, str] | None = None, tmp_dir: str | None = None):
        self.limits = limits or Limits()
        self.env = dict(env or {})
        self.owner: tuple[int, int] | None = None  # host uid/gid the sandbox writes as, when not ours
        self._tmp_dir = tmp_dir
        self._root: Path | None = None
        self._fs: ConfinedFS | None = None
        self._agent: asyncio.subprocess.Process | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._procs: dict[int, AgentProcess] = {}
        self._pgids: set[int] = set()
        self._kill_acks: dict[int, list[asyncio.Future[None]]] = {}
        self._ids = itertools.count(1)
        self._stderr = HeadTail(4096)
        self._state = "new"  # new -> running -> (dead) -> closed

    # -- paths ------------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        if self._root is None:
            raise SandboxError(f"{self.kind} sandbox is not started")
        return self._root

    def inside(self, rel: str) -> str:
        """The inside path of ``T/rel``."""
        return "/" + rel if self.mirror else str(self.root / rel)

    @property
    def workspace(self) -> str:
        return self.inside("workspace")

    @property
    def scratch(self) -> str:
        return self.inside("run/raas/scratch")

    def host_path(self, path: str) -> Path:
        return self.root / self._relative(path)

    def _relative(self, path: str) -> str:
        """``path`` (inside; relative = to the workspace) as a path relative to ``T``."""
        full = posixpath.normpath(posixpath.join(self.workspace, path))
        for area in (self.workspace, self.scratch):
            if full == area or full.startswith(area + "/"):
                return posixpath.relpath(full, self.inside("."))
        raise SandboxError(f"{path!r} is outside the workspace ({self.workspace})")

    # -- lifecycle ---------------------------------------------------------------------------
    async def __aenter__(self) -> AgentSandbox:
        await self.start()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def start(self) -> None:
        if self._state != "new":
            raise SandboxError(f"{self.kind} sandbox was already started")
        self._state = "starting"
        try:
            self._make_layout()
            self._agent = await self._launch(self._process_env())
            assert self._agent.stdout is not None and self._agent.stderr is not None
            self._tasks.append(asyncio.create_task(self._pump_stderr(self._agent.stderr)))
            try:
                line = await asyncio.wait_for(self._agent.stdout.readline(), self.start_timeout)
            except TimeoutError:
                line = b""
            if line != b"ready\n":
                await asyncio.wait(self._tasks, timeout=1)  # the launcher's last words, up to its EOF
                raise SandboxError(f"{self.kind} sandbox failed to start: {self.diagnostics() or 'no output'}")
            self._fs = ConfinedFS(str(self.root) if self.mirror else "/", self.owner)
            self._tasks.append(asyncio.create_task(self._replies(self._agent.stdout)))
            self._state = "running"
        except BaseException:
            await self.close()
            raise

    def _make_layout(self) -> None:
        self._root = Path(tempfile.mkdtemp(prefix="raas-", dir=self._tmp_dir))
        self._root.chmod(0o711)  # the sandbox user may traverse to its binds, not list them
        for rel in ("workspace", "run/raas/ctl", "run/raas/scratch"):
            (self._root / rel).mkdir(parents=True, mode=0o755)
        if self.owner:
            for rel in ("workspace", "run/raas/scratch"):
                os.chown(self._root / rel, *self.owner)

    def _process_env(self) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": self.workspace, "LANG": "C.UTF-8", "TMPDIR": "/tmp", "USER": "sandbox",
        }
        env.update(self.env)
        return env

    async def _launch(self, env: dict[str, str]) -> asyncio.subprocess.Process:
        """Start ``/bin/sh -c AGENT raas-agent <ctl dir>`` in the sandbox, with piped stdio."""
        raise NotImplementedError

    def agent_argv(self, shell: str = "/bin/sh", prelude: str = "") -> list[str]:
        """The agent's command line; ``prelude`` runs first (and must succeed)."""
        script = f"{prelude} || exit 1\n{AGENT}" if prelude else AGENT
        return [shell, "-c", script, "raas-agent", self.inside("run/raas/ctl")]

    async def close(self) -> None:
        if self._state == "closed":
            return
        self._state = "closed"
        for proc in list(self._procs.values()):
            proc._exited(KILLED)
        self._procs.clear()
        if self._agent is not None:
            try:
                await self._terminate()
            except Exception:  # keep cleaning up; the kind's own teardown says what went wrong
                log.exception("%s sandbox: terminating failed", self.kind)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._fs is not None:
            self._fs.close()
        if self._root is not None:
            _force_rmtree(self._root)

    async def _terminate(self) -> None:
        """Stop everything the sandbox runs. Default: end the agent; the kind's process tree
        (a pid namespace) goes with it. Called once, from ``close``."""
        agent = self._agent
        assert agent is not None
        if agent.stdin is not None:
            agent.stdin.close()
        if agent.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                agent.kill()
        await agent.wait()

    def diagnostics(self) -> str:
        """The tail of what the launcher and agent wrote to stderr (for error messages)."""
        return self._stderr.getvalue().decode("utf-8", "replace").strip()

    @property
    def alive(self) -> bool:
        return self._state == "running"

    def _check(self) -> None:
        if self._state == "running":
            return
        state = {"new": "not started", "dead": "dead (its agent exited)"}.get(self._state, self._state)
        detail = f": {self.diagnostics()}" if self._state == "dead" and self.diagnostics() else ""
        raise SandboxError(f"{self.kind} sandbox is {state}{detail}")

    async def _pump_stderr(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(4096):
            self._stderr.add(chunk)

    async def _replies(self, stream: asyncio.StreamReader) -> None:
        try:
            while line := await stream.readline():
                self._on_reply(line)
        except (ValueError, asyncio.LimitOverrunError):
            log.warning("%s sandbox: garbled agent reply stream; treating the sandbox as dead", self.kind)
        finally:
            if self._state == "running":
                self._state = "dead"
            for proc in list(self._procs.values()):
                proc._exited(KILLED)
            self._procs.clear()
            for waiters in self._kill_acks.values():
                for w in waiters:
                    if not w.done():
                        w.set_result(None)

    def _on_reply(self, line: bytes) -> None:
        m = _REPLY.fullmatch(line)
        if m is None:
            return  # only the sandboxed code could have written it; ignore
        what, a, b = m.group(1), int(m.group(2)), m.group(3)
        if what == b"killed":
            for w in self._kill_acks.pop(a, []):
                if not w.done():
                    w.set_result(None)
            return
        proc = self._procs.get(a)
        if proc is None or b is None:
            return
        if what == b"pid" and not proc.pgid.done():
            self._pgids.add(int(b))
            proc.pgid.set_result(int(b))
        elif what == b"exit":
            self._forget(proc, int(b))

    def _forget(self, proc: AgentProcess, code: int) -> None:
        proc._exited(code)
        self._procs.pop(proc.id, None)
        ctl = self.root / "run/raas/ctl"
        for suffix in (".sh", ".in", ".out", ".err"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(ctl / f"{proc.id}{suffix}")

    def _request(self, line: str) -> None:
        agent = self._agent
        assert agent is not None and agent.stdin is not None
        try:
            agent.stdin.write(line.encode() + b"\n")
        except (BrokenPipeError, ConnectionResetError, RuntimeError) as e:
            self._state = "dead"
            raise SandboxError(f"{self.kind} sandbox agent is gone: {e}") from None

    # -- processes ---------------------------------------------------------------------------
    async def spawn(
        self, cmd: str | Sequence[str], *, pty: bool = False, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> AgentProcess:
        return self._start(cmd, pty=pty, cwd=cwd, env=env, stdin=None, stream_stdin=True)

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
        proc = self._start(cmd, pty=False, cwd=cwd, env=env, stdin=stdin, stream_stdin=False)
        out, err = HeadTail(max_output), HeadTail(max_output)
        pumps = [asyncio.create_task(_pump(proc.read, out)), asyncio.create_task(_pump(proc.read_stderr, err))]
        timed_out = False
        try:
            try:
                code = await asyncio.wait_for(proc.wait(), timeout if timeout is not None else self.limits.timeout)
            except TimeoutError:
                timed_out = True
                await proc.kill()
                code = await proc.wait()
            await asyncio.gather(*pumps)
        except asyncio.CancelledError:
            for p in pumps:
                p.cancel()
            self._background(proc.kill())
            raise
        return ExecResult(code, out.getvalue(), err.getvalue(), timed_out, out.dropped, err.dropped)

    def _start(
        self, cmd: str | Sequence[str], *, pty: bool, cwd: str | None, env: Mapping[str, str] | None,
        stdin: bytes | None, stream_stdin: bool,
    ) -> AgentProcess:
        self._check()
        argv = ["/bin/sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not argv:
            raise ValueError("empty command")
        pid = next(self._ids)
        ctl = self.root / "run/raas/ctl"
        out = self._fifo(ctl / f"{pid}.out", os.O_RDONLY)
        err = None if pty else self._fifo(ctl / f"{pid}.err", os.O_RDONLY)
        inp = self._fifo(ctl / f"{pid}.in", os.O_RDWR) if stream_stdin else None
        if stdin is not None:
            (ctl / f"{pid}.in").write_bytes(stdin)
        stdin_path = self.inside(f"run/raas/ctl/{pid}.in") if stream_stdin or stdin is not None else "/dev/null"
        script = self._wrapper(pid, argv, pty=pty, cwd=cwd or self.workspace, env=env or {}, stdin_path=stdin_path)
        (ctl / f"{pid}.sh").write_text(script)
        proc = AgentProcess(self, pid, pty, out, err, inp)
        self._procs[pid] = proc
        try:
            self._request(f"run {pid}")
        except SandboxError:
            self._forget(proc, KILLED)
            raise
        return proc

    def _fifo(self, path: Path, flags: int) -> int:
        os.mkfifo(path, 0o600)
        if self.owner:
            os.chown(path, *self.owner)
        return os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC)

    def _wrapper(self, pid: int, argv: list[str], *, pty: bool, cwd: str, env: Mapping[str, str], stdin_path: str) -> str:
        q = shlex.quote
        ctl = self.inside("run/raas/ctl")
        err = "&1" if pty else q(f"{ctl}/{pid}.err")
        steps = [f"cd -- {q(cwd)}"]
        env = dict(env)
        if pty:  # script(1) gives the command a terminal of its own; it runs $SHELL -c
            env["SHELL"] = "/bin/sh"
            argv = ["script", "-qfec", shlex.join(argv), "/dev/null"]
        for k, v in env.items():
            if not _ENV_KEY.fullmatch(k):
                raise ValueError(f"invalid environment variable name {k!r}")
            steps.append(f"export {q(f'{k}={v}')}")
        steps.append(f"{shlex.join(argv)} 3>&-")
        return (
            f"exec <{q(stdin_path)} >{q(f'{ctl}/{pid}.out')} 2>{err}\n"
            f'echo "pid {pid} ${{BASHPID:-$$}}" >&3\n'
            f"{' && '.join(steps)}\n"
            f'echo "exit {pid} $?" >&3\n'
        )

    async def _kill(self, proc: AgentProcess) -> None:
        if proc.returncode is not None:
            return
        try:
            pgid = await asyncio.wait_for(asyncio.shield(proc.pgid), 10)
        except (TimeoutError, SandboxError):
            self._forget(proc, KILLED)
            return
        if self._state == "running":
            ack = asyncio.get_running_loop().create_future()
            waiters = self._kill_acks.setdefault(pgid, [])
            waiters.append(ack)
            try:
                self._request(f"kill {pgid}")
                await asyncio.wait_for(ack, 10)
            except (TimeoutError, SandboxError):
                pass  # the agent is gone or stuck: the sandbox's end will take the process with it
            finally:
                if ack in waiters:
                    waiters.remove(ack)
                if not waiters:
                    self._kill_acks.pop(pgid, None)
        self._forget(proc, KILLED)

    def _background(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(asyncio.ensure_future(coro))

    # -- files -------------------------------------------------------------------------------
    async def read_file(self, path: str, *, max_bytes: int = 64 << 20) -> bytes:
        self._check()
        assert self._fs is not None
        return self._fs.read(self._fs_path(path), max_bytes)

    async def write_file(self, path: str, data: bytes, *, mode: int = 0o644) -> None:
        self._check()
        assert self._fs is not None
        self._fs.write(self._fs_path(path), data, mode)

    def _fs_path(self, path: str) -> str:
        rel = self._relative(path)
        return rel if self.mirror else str(self.root / rel).lstrip("/")


async def _pump(read: Callable[[int], Awaitable[bytes]], sink: HeadTail) -> None:
    while chunk := await read(1 << 16):
        sink.add(chunk)


def _force_rmtree(path: Path) -> None:
    """Remove a sandbox's directory even where the sandboxed code removed our permissions."""

    def fix(func: object, p: str, exc: object) -> None:
        parent = os.path.dirname(p)
        with contextlib.suppress(OSError):
            os.chmod(parent, stat.S_IRWXU)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, stat.S_IRWXU)
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.unlink(p)

    shutil.rmtree(path, onerror=fix)
