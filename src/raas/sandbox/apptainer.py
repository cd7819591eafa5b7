"""Apptainer (Singularity) sandboxes: the agent runs in a given image, with no daemon.

``apptainer exec --containall --writable-tmpfs --net --network none IMAGE /bin/sh -c AGENT``:
``--containall`` gives new pid and ipc namespaces, a clean environment and a private /tmp and
home; ``--writable-tmpfs`` lets commands write to the image's file system (discarded at the
end); ``--net --network none`` leaves only a loopback interface (omitted with
``network=True``). The workspace, control and scratch directories are bound in at the same
inside paths as for bubblewrap. The rlimits are set on the apptainer process and inherited by
everything inside; note that RLIMIT_NPROC then counts the calling host user's processes.
The image needs /bin/sh and util-linux ``setsid`` (and ``script`` for ptys).

The container's processes live in its pid namespace, whose init ends when the agent ends:
``close`` closes the agent's stdin and, if that is not enough, kills apptainer's process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from collections.abc import Mapping, Sequence
from typing import ClassVar

from raas.sandbox.agent import AgentSandbox
from raas.sandbox.base import Limits, SandboxError


def binary() -> str | None:
    return shutil.which("apptainer") or shutil.which("singularity")


def available() -> bool:
    return binary() is not None


class ApptainerSandbox(AgentSandbox):
    kind: ClassVar[str] = "apptainer"
    isolated: ClassVar[bool] = True
    start_timeout = 120.0  # a first run may convert or unpack the image

    def __init__(
        self,
        image: str,
        *,
        limits: Limits | None = None,
        network: bool = False,
        env: Mapping[str, str] | None = None,
        apptainer: str | None = None,
        extra_args: Sequence[str] = (),
        tmp_dir: str | None = None,
    ):
        """``image``: a .sif file or an unpacked image directory (or any URI apptainer takes)."""
        super().__init__(limits=limits, env=env, tmp_dir=tmp_dir)
        self.image = image
        self.network = network
        self.apptainer = apptainer or binary() or "apptainer"
        self.extra_args = list(extra_args)

    def apptainer_argv(self, env: Mapping[str, str]) -> list[str]:
        a = ["prlimit", *self.limits.prlimit_args(), "--", self.apptainer, "exec", "--containall", "--writable-tmpfs"]
        if not self.network:
            a += ["--net", "--network", "none"]
        a += ["--bind", f"{self.root / 'workspace'}:/workspace", "--bind", f"{self.root / 'run/raas/ctl'}:/run/raas/ctl:ro",
              "--bind", f"{self.root / 'run/raas/scratch'}:/run/raas/scratch", "--pwd", "/workspace"]
        for k, v in env.items():
            a += ["--env", f"{k}={v}"]
        return a + self.extra_args + [self.image, *self.agent_argv()]

    async def _launch(self, env: dict[str, str]) -> asyncio.subprocess.Process:
        if "://" not in self.image and not os.path.exists(self.image):
            raise SandboxError(f"apptainer image {self.image!r} not found")
        try:
            return await asyncio.create_subprocess_exec(
                *self.apptainer_argv(env), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True,
            )
        except FileNotFoundError:
            raise SandboxError(f"{self.apptainer} not found; install Apptainer") from None

    async def _terminate(self) -> None:
        agent = self._agent
        assert agent is not None and agent.stdin is not None
        agent.stdin.close()  # the agent exits, and its pid namespace with it
        try:
            await asyncio.wait_for(agent.wait(), 5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(agent.pid, signal.SIGKILL)
            await agent.wait()
