"""The local "sandbox": plain host processes in a temporary directory. Development only.

It isolates nothing: commands run as the calling user, see the whole host file system and
network, and can signal any of the user's processes. What it does keep from the contract:
the same agent protocol, a private workspace directory (removed on close), per-command
timeouts that kill the command's process group, bounded output, and the per-process rlimits
(CPU, address space, file size, open files; not the process count, which would count all of
the user's host processes). ``close`` kills the process groups of everything it started; a
daemon that moved to a session of its own survives it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
from typing import ClassVar

from raas.sandbox.agent import AgentSandbox

log = logging.getLogger(__name__)


class LocalSandbox(AgentSandbox):
    kind: ClassVar[str] = "local"
    isolated: ClassVar[bool] = False
    mirror: ClassVar[bool] = False

    async def start(self) -> None:
        log.warning("local sandbox: commands run unisolated on the host (development only)")
        await super().start()

    def _process_env(self) -> dict[str, str]:
        env = super()._process_env()
        env["PATH"] = os.environ.get("PATH", env["PATH"])  # host tools, as a developer expects
        return env

    async def _launch(self, env: dict[str, str]) -> asyncio.subprocess.Process:
        bash = shutil.which("bash") or "/bin/bash"
        return await asyncio.create_subprocess_exec(
            *self.agent_argv(bash, self.limits.ulimit_command(processes=False)),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=env, cwd=self.workspace, start_new_session=True,
        )

    async def _terminate(self) -> None:
        # Without a pid namespace, the agent's end is not its commands' end: kill their groups.
        # A group id stays reserved while any member lives; only a group that emptied out and
        # whose id was reused by a new group leader within this sandbox's life could be hit.
        for pgid in self._pgids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        await super()._terminate()
