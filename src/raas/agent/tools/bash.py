"""The ``bash`` tool: one persistent interactive bash on a pseudo-terminal inside a sandbox.

How a call works: the shell is sent one line, ``__raas_seq=N; eval '<command>'``. Only a short
command of printable characters travels on the terminal like that; any other text (newlines,
control characters, more than the terminal's 4 KiB line buffer) is written to a file in the
sandbox's scratch directory, and the line makes the shell read it into a variable and ``eval``
that, so the terminal's line discipline never sees it. Because the command runs in the shell
itself, ``cd``,
variables, functions and background jobs persist. Completion is detected without polling:
``PROMPT_COMMAND`` prints an end marker (a per-shell random token, the call's sequence number
and ``$?``) to /dev/tty before every prompt, and the tool reads the pty until that marker
arrives (the sequence number discards a stale marker, e.g. from a Ctrl-C that raced the end
of the previous command).

A command that outlives its timeout gets a Ctrl-C (SIGINT to the terminal's foreground
process group, as in a terminal), then SIGKILL to that group, and if the shell still does not
come back it is replaced by a fresh one (state lost, said so in the result). Output over
``output_limit_bytes`` is treated the same way: the host stops spending CPU on a runaway
stream. At most ``max_output_chars`` characters are returned (head and tail, with a marker
between), after ANSI escapes are removed and carriage-return overwrites are applied.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import shlex
from typing import Any

from raas.agent.tools.base import ToolResult
from raas.sandbox.base import HeadTail, Sandbox, SandboxError, SandboxProcess

_ENV = {
    "TERM": "dumb", "PAGER": "cat", "GIT_PAGER": "cat", "MANPAGER": "cat", "SYSTEMD_PAGER": "",
    "GIT_TERMINAL_PROMPT": "0", "DEBIAN_FRONTEND": "noninteractive",
}
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
_KILL_FOREGROUND = (  # $1 = the shell's pid; field 8 of /proc/PID/stat is the tty's foreground group
    'read -r _ _ _ _ _ _ _ fg _ < "/proc/$1/stat" && [ "$fg" -gt 1 ] && [ "$fg" != "$1" ] && kill -s KILL -- "-$fg"'
)


class _ShellGone(Exception):
    pass


class BashTool:
    name = "bash"
    description = (
        "Run a bash command in a persistent shell inside the sandbox. The working directory, environment "
        "variables and background jobs persist between calls. Returns stdout and stderr (interleaved, long "
        "output shortened in the middle) and the exit code. Interactive programs get no input: use "
        "non-interactive flags."
    )
    parameters = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "the bash command(s) to run"},
            "timeout": {"type": "number", "description": "seconds before the command is interrupted (default 30)"},
        },
        "required": ["command"],
    }

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        timeout: float = 30.0,
        max_timeout: float = 600.0,
        max_output_chars: int = 10_000,
        output_limit_bytes: int = 32 << 20,
        interrupt_grace: float = 2.0,
        startup_timeout: float = 30.0,
    ):
        self.sandbox = sandbox
        self.timeout, self.max_timeout = timeout, max_timeout
        self.max_output_chars = max_output_chars
        self.output_limit_bytes = output_limit_bytes
        self.interrupt_grace = interrupt_grace
        self.startup_timeout = startup_timeout
        self._token = secrets.token_hex(8).encode()
        self._marker = re.compile(rb"\x1e" + self._token + rb":(\d+):(\d+)\x1e")
        self._proc: SandboxProcess | None = None
        self._pid = 0  # the shell's pid as seen inside the sandbox
        self._seq = 0
        self._buf = bytearray()  # read from the pty but not yet attributed to a command
        self._lock = asyncio.Lock()

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        command = arguments.get("command")
        if not isinstance(command, str) or not command.strip():
            return ToolResult("Error: bash needs a non-empty string argument 'command'", ok=False)
        timeout = arguments.get("timeout", self.timeout)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            return ToolResult("Error: 'timeout' must be a positive number of seconds", ok=False)
        async with self._lock:
            try:
                if self._proc is None or self._proc.returncode is not None:
                    await self._start()
                return await self._run(command, min(float(timeout), self.max_timeout))
            except SandboxError as e:
                await self._discard()
                return ToolResult(f"Error: the sandbox cannot run commands: {e}", ok=False)

    async def close(self) -> None:
        async with self._lock:
            await self._discard()

    # -- the shell -----------------------------------------------------------------------------
    async def _start(self) -> None:
        self._buf.clear()
        self._cmd_path = f"{self.sandbox.scratch}/bash-{self._token.decode()}.sh"
        argv = ["bash", "--noediting", "--noprofile", "--norc", "-i"]
        self._proc = await self.sandbox.spawn(argv, pty=True, env=_ENV)
        tok = self._token.decode()
        prompt = f'__raas_rc=$?; printf "\\036{tok}:%s:%s\\036" "${{__raas_seq:-0}}" "$__raas_rc" >/dev/tty'
        self._proc.write(
            f"stty -echo -opost cols 200 rows 50 2>/dev/null; set +o history +H; unset HISTFILE; PS1=''; PS2=''; PS0=''; "
            f"PROMPT_COMMAND={shlex.quote(prompt)}; readonly PROMPT_COMMAND; printf '\\036{tok}-pid:%s\\036' \"$$\"\n".encode()
        )
        sink = HeadTail(1 << 16)
        self._seq = 0
        try:
            if await self._collect(sink, asyncio.get_running_loop().time() + self.startup_timeout) is None:
                raise SandboxError(f"bash did not start within {self.startup_timeout:g}s")
        except _ShellGone:
            raise SandboxError(f"bash exited at startup: {sink.getvalue()[-500:]!r}") from None
        m = re.search(rb"\x1e" + self._token + rb"-pid:(\d+)\x1e", sink.getvalue())
        if m is None:
            raise SandboxError("bash did not report its pid")
        self._pid = int(m.group(1))

    async def _discard(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(SandboxError):
                await proc.kill()

    # -- one command ---------------------------------------------------------------------------
    async def _run(self, command: str, timeout: float) -> ToolResult:
        assert self._proc is not None
        self._seq += 1
        quoted = shlex.quote(command)
        if command.isprintable() and len(quoted) < 1024:  # nothing the line discipline would act on
            line = f"__raas_seq={self._seq}; eval {quoted}\n"
        else:
            await self.sandbox.write_file(self._cmd_path, command.encode())
            # read, not $(< file): a command substitution forks, and on a busy host a fork costs
            # a scheduling round trip that dominates the latency.
            path = shlex.quote(self._cmd_path)
            line = f"__raas_seq={self._seq}; IFS= read -r -d '' __raas_cmd < {path}; eval \"$__raas_cmd\"\n"
        self._proc.write(line.encode())
        loop = asyncio.get_running_loop()
        sink = HeadTail(4 * self.max_output_chars)
        try:
            code = await self._collect(sink, loop.time() + timeout)
            if code is not None:
                return ToolResult(self._format(sink, f"[exit code: {code}]"))
            why = (f"output exceeded {self.output_limit_bytes >> 20} MiB" if sink.total > self.output_limit_bytes
                   else f"timed out after {timeout:g}s")
            code = await self._interrupt(sink)
        except _ShellGone:
            rc = await self._proc.wait() if self._proc else -1
            self._proc = None
            return ToolResult(self._format(sink, f"[the shell exited with code {rc}; the next command starts a new shell]"))
        if code is None:
            await self._discard()
            return ToolResult(self._format(sink, f"[{why}; the command ignored SIGINT and SIGKILL, so the shell was "
                                                 "restarted: working directory, variables and jobs are lost]"), ok=False)
        return ToolResult(self._format(sink, f"[{why}; interrupted, exit code: {code}]"), ok=False)

    async def _interrupt(self, sink: HeadTail) -> int | None:
        """Ctrl-C, then SIGKILL to the terminal's foreground group; the exit code, or None."""
        assert self._proc is not None
        loop = asyncio.get_running_loop()
        self._proc.write(b"\x03")
        code = await self._collect(sink, loop.time() + self.interrupt_grace, limit=False)
        if code is None:
            await self.sandbox.exec(["/bin/sh", "-c", _KILL_FOREGROUND, "sh", str(self._pid)], timeout=10)
            code = await self._collect(sink, loop.time() + self.interrupt_grace, limit=False)
        return code

    async def _collect(self, sink: HeadTail, deadline: float, *, limit: bool = True) -> int | None:
        """Move pty output into ``sink`` until this call's marker (its exit code is returned),
        the deadline or, with ``limit``, the output limit (None). Raises _ShellGone at EOF."""
        assert self._proc is not None
        loop = asyncio.get_running_loop()
        buf = self._buf
        while True:
            while m := self._marker.search(buf):
                seq, code, start, end = int(m.group(1)), int(m.group(2)), m.start(), m.end()
                if seq == self._seq:
                    sink.add(bytes(buf[:start]))
                    del buf[:end]
                    return code
                del buf[start:end]  # stale marker of an earlier call
            if len(buf) > 256:  # keep a tail that may hold the start of a marker
                sink.add(bytes(buf[:-64]))
                del buf[:-64]
            if limit and sink.total > self.output_limit_bytes:
                return None
            try:
                chunk = await asyncio.wait_for(self._proc.read(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                return None
            if not chunk:
                sink.add(bytes(buf))
                buf.clear()
                raise _ShellGone
            buf += chunk

    def _format(self, sink: HeadTail, status: str) -> str:
        head, tail = sink.parts()
        half = self.max_output_chars // 2
        text = _clean(head)
        if sink.dropped or len(text) + len(tail) > self.max_output_chars:
            end = _clean(tail)
            cut = sink.dropped + max(0, len(text) - half) + max(0, len(end) - half)
            text = f"{text[:half]}\n[... {cut} characters cut ...]\n{end[-half:] if half else ''}"
        else:
            text += _clean(tail)
        text = text.rstrip("\n")
        return f"{text}\n{status}" if text else status


def _clean(data: bytes) -> str:
    """Terminal bytes to plain text: no ANSI escapes, ``\\r`` overwrites applied."""
    text = _ANSI.sub("", data.decode("utf-8", "replace")).replace("\r\n", "\n")
    return "\n".join(line.rsplit("\r", 1)[-1] for line in text.split("\n"))
