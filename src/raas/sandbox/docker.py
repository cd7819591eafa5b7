"""Docker sandboxes: the agent runs as the main process of a throwaway container.

``docker run --rm -i --init --network none --cap-drop ALL --security-opt no-new-privileges
--pids-limit N --memory M --ulimit ... --user 65534:65534 IMAGE /bin/sh -c AGENT``, with the
workspace, control and scratch directories bound at the same inside paths as for bubblewrap.
Memory and the process count are enforced by the container's cgroup (the whole container,
not per process); CPU seconds, file size and open files are rlimits. The image needs /bin/sh
and util-linux ``setsid`` (and ``script`` for ptys). ``close`` removes the container
(``docker rm -f``), which kills everything in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import ClassVar

from raas.sandbox.agent import AgentSandbox
from raas.sandbox.base import Limits, SandboxError


def available(docker: str = "docker") -> bool:
    """True when a docker CLI is installed and its daemon answers."""
    if shutil.which(docker) is None:
        return False
    try:
        return subprocess.run([docker, "info"], capture_output=True, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class DockerSandbox(AgentSandbox):
    kind: ClassVar[str] = "docker"
    isolated: ClassVar[bool] = True
    start_timeout = 300.0  # the first run may pull the image

    def __init__(
        self,
        image: str,
        *,
        limits: Limits | None = None,
        network: bool = False,
        user: str = "65534:65534",
        read_only: bool = False,
        env: Mapping[str, str] | None = None,
        docker: str = "docker",
        extra_args: Sequence[str] = (),
        tmp_dir: str | None = None,
    ):
        """``user`` is uid:gid (numeric: the workspace is chowned to it); ``read_only`` makes the
        image's file system read-only (only the workspace and /tmp stay writable)."""
        super().__init__(limits=limits, env=env, tmp_dir=tmp_dir)
        self.image = image
        self.network = network
        self.docker = docker
        self.read_only = read_only
        self.extra_args = list(extra_args)
        self.name = f"raas-{secrets.token_hex(6)}"
        uid, _, gid = user.partition(":")
        if not (uid.isdigit() and gid.isdigit()):
            raise ValueError(f"user must be numeric uid:gid, got {user!r}")
        self.user = user
        self.owner = (int(uid), int(gid))

    def docker_argv(self, env: Mapping[str, str]) -> list[str]:
        lim = self.limits
        a = [self.docker, "run", "--rm", "-i", "--init", "--name", self.name, "--cap-drop", "ALL",
             "--security-opt", "no-new-privileges", "--user", self.user, "--network", "bridge" if self.network else "none"]
        if lim.max_processes:
            a += ["--pids-limit", str(lim.max_processes)]
        if lim.memory_bytes:
            a += ["--memory", str(lim.memory_bytes), "--memory-swap", str(lim.memory_bytes)]
        for name, v in (("cpu", lim.cpu_seconds), ("fsize", lim.file_size_bytes), ("nofile", lim.open_files)):
            if v is not None:
                a += ["--ulimit", f"{name}={v}:{v}"]
        tmp = f",size={lim.tmp_bytes}" if lim.tmp_bytes else ""
        a += ["--tmpfs", f"/tmp:rw,nosuid,nodev,mode=1777{tmp}"]
        if self.read_only:
            a.append("--read-only")
        a += ["-v", f"{self.root / 'workspace'}:/workspace", "-v", f"{self.root / 'run/raas/ctl'}:/run/raas/ctl:ro",
              "-v", f"{self.root / 'run/raas/scratch'}:/run/raas/scratch", "-w", "/workspace"]
        for key, value in env.items():
            a += ["-e", f"{key}={value}"]
        return a + self.extra_args + ["--entrypoint", "/bin/sh", self.image, *self.agent_argv()[1:]]

    async def _launch(self, env: dict[str, str]) -> asyncio.subprocess.Process:
        try:
            return await asyncio.create_subprocess_exec(
                *self.docker_argv(env), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except FileNotFoundError:
            raise SandboxError(f"{self.docker} not found; install Docker") from None

    async def _terminate(self) -> None:
        rm = await asyncio.create_subprocess_exec(
            self.docker, "rm", "-f", self.name, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(rm.wait(), 30)
        await super()._terminate()
