"""Bubblewrap sandboxes: rootless Linux namespaces that start in milliseconds.

What the sandboxed code gets: new user, pid, mount, network, ipc, uts and cgroup namespaces
(``--unshare-all``; the host network only with ``network=True``); a root made of read-only
binds of the system directories (/usr and its /bin, /lib* links), a minimal /etc (no host
passwd), the host Python environment read-only (so the python tool's kernel can run), a fresh
/proc and minimal /dev, a private size-capped tmpfs /tmp, the read-write workspace at
/workspace, and no capabilities. ``--die-with-parent`` ties the sandbox to the host process,
``--new-session`` keeps it off the host terminal. Every process lives in the sandbox's pid
namespace, so killing bubblewrap (``close``) kills them all.

Users, and why it matters for the process limit: RLIMIT_NPROC is counted per user *within a
user namespace*, so inside a fresh namespace it caps the sandbox as a whole, but the kernel
never enforces it for host root. Run as an ordinary user, bubblewrap maps sandbox uid 1000 to
that user and ``--disable-userns`` forbids nested namespaces. Run as root, it would map the
sandbox to host root (no process limit, and root's ownership of every host file), so we write
the namespace's uid/gid maps ourselves (``--userns-block-fd``): sandbox uid 1000 becomes an
unprivileged host uid (``host_uid``, default 65534 "nobody"), and ``setpriv`` drops to it with
an empty capability set before the agent starts. (That path cannot use ``--disable-userns``,
which is bubblewrap's own two-level mapping.) Host uid 0 is mapped inside only because
bubblewrap's setup steps run as it; nothing in the sandbox can return to it (no capabilities,
no_new_privs, nosuid mounts).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from raas.sandbox.agent import AgentSandbox
from raas.sandbox.base import Limits, SandboxError

SANDBOX_UID = 1000
NOBODY = 65534
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# Enough of /etc for the dynamic linker, Debian's alternatives links, time zones and name lookups.
_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/localtime",
        "/etc/nsswitch.conf", "/etc/hosts", "/etc/host.conf")
_ETC_NET = ("/etc/resolv.conf", "/etc/gai.conf", "/etc/ssl", "/etc/ca-certificates", "/etc/pki")
_PASSWD = (
    f"root:x:0:0:root:/root:/bin/sh\nsandbox:x:{SANDBOX_UID}:{SANDBOX_UID}:sandbox:/workspace:/bin/bash\n"
    f"nobody:x:{NOBODY}:{NOBODY}:nobody:/nonexistent:/usr/sbin/nologin\n"
)
_GROUP = f"root:x:0:\nsandbox:x:{SANDBOX_UID}:\nnogroup:x:{NOBODY}:\n"


def available() -> bool:
    return shutil.which("bwrap") is not None


def host_python_paths() -> list[str]:
    """The host interpreter's environment (venv and base installation), outside /usr."""
    paths: list[str] = []
    for p in (sys.prefix, sys.base_prefix):
        real = os.path.realpath(p)
        for q in dict.fromkeys((p, real)):
            if not any(q == d or q.startswith(d + "/") for d in (*_SYSTEM_DIRS, *paths)):
                paths.append(q)
    return paths


class BwrapSandbox(AgentSandbox):
    kind: ClassVar[str] = "bwrap"
    isolated: ClassVar[bool] = True

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        network: bool = False,
        python: bool = True,
        ro_binds: Sequence[str | tuple[str, str]] = (),
        env: Mapping[str, str] | None = None,
        host_uid: int | None = None,
        bwrap: str = "bwrap",
        tmp_dir: str | None = None,
    ):
        """``python`` binds the host interpreter's environment read-only at its own path;
        ``ro_binds`` adds paths (or (host, inside) pairs); ``host_uid`` is the unprivileged host
        user the sandbox runs as when we are root (ignored otherwise)."""
        super().__init__(limits=limits, env=env, tmp_dir=tmp_dir)
        self.network = network
        self.bwrap = bwrap
        self.bash = shutil.which("bash") or "/bin/bash"  # inside, /usr is the host's
        self.ro_binds = [(p, p) for p in host_python_paths()] if python else []
        self.ro_binds += [(b, b) if isinstance(b, str) else b for b in ro_binds]
        self.map_user = os.geteuid() == 0
        if self.map_user:
            uid = NOBODY if host_uid is None else host_uid
            self.owner = (uid, uid)

    def bwrap_argv(self) -> list[str]:
        """The bubblewrap command line, without the user-mapping handshake fds."""
        a = [self.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--hostname", "sandbox",
             "--cap-drop", "ALL", "--unshare-user"]
        if self.network:
            a.append("--share-net")
        if self.map_user:  # kept only until setpriv has switched user
            a += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
        else:
            a += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--disable-userns"]
        for d in _SYSTEM_DIRS:
            if os.path.islink(d):
                a += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                a += ["--ro-bind", d, d]
        for f in _ETC + (_ETC_NET if self.network else ()):
            if os.path.exists(f):
                a += ["--ro-bind", f, f]
        a += ["--ro-bind", str(self.root / "passwd"), "/etc/passwd", "--ro-bind", str(self.root / "group"), "/etc/group"]
        a += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777"]
        if self.limits.tmp_bytes:
            a += ["--size", str(self.limits.tmp_bytes)]
        a += ["--tmpfs", "/tmp"]
        made: set[str] = {"/", "/tmp", "/dev", "/proc", "/etc", *_SYSTEM_DIRS}
        for src, dst in self.ro_binds:
            a += _parents(dst, made) + ["--ro-bind", src, dst]
        for rel, flag in (("workspace", "--bind"), ("run/raas/ctl", "--ro-bind"), ("run/raas/scratch", "--bind")):
            a += _parents("/" + rel, made) + [flag, str(self.root / rel), "/" + rel]
        a += ["--chdir", "/workspace"]
        if self.map_user:
            a += ["setpriv", f"--reuid={SANDBOX_UID}", f"--regid={SANDBOX_UID}", "--clear-groups",
                  "--inh-caps=-all", "--bounding-set=-all", "--"]
        return a + self.agent_argv(self.bash, self.limits.ulimit_command())

    async def _launch(self, env: dict[str, str]) -> asyncio.subprocess.Process:
        (self.root / "passwd").write_text(_PASSWD)
        (self.root / "group").write_text(_GROUP)
        argv = self.bwrap_argv()
        if not self.map_user:
            return await _spawn(argv, env, ())
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        argv[1:1] = ["--info-fd", str(info_w), "--userns-block-fd", str(block_r)]
        try:
            proc = await _spawn(argv, env, (info_w, block_r))
            os.close(info_w)
            os.close(block_r)
            info_w = block_r = -1
            info = await _read_to_eof(info_r)
            try:
                child = int(json.loads(info)["child-pid"])
                for name in ("uid_map", "gid_map"):
                    Path(f"/proc/{child}/{name}").write_text(f"0 0 1\n{SANDBOX_UID} {self.owner[0]} 1\n")  # type: ignore[index]
            except (ValueError, KeyError, OSError) as e:
                proc.kill()
                raise SandboxError(f"bwrap user namespace setup failed ({e}); is bwrap usable here?") from None
            os.write(block_w, b"1")
            return proc
        finally:
            for fd in (info_r, info_w, block_r, block_w):
                if fd >= 0:
                    os.close(fd)


def _parents(path: str, made: set[str]) -> list[str]:
    """``--dir`` options creating the missing ancestors of ``path`` world-traversable: left to
    itself bubblewrap copies the host's modes, and /root (0700) would lock the sandbox user out."""
    out: list[str] = []
    parts = path.strip("/").split("/")[:-1]
    for i in range(1, len(parts) + 1):
        d = "/" + "/".join(parts[:i])
        if d not in made:
            made.add(d)
            out += ["--perms", "0755", "--dir", d]
    return out


async def _spawn(argv: list[str], env: dict[str, str], fds: Sequence[int]) -> asyncio.subprocess.Process:
    try:
        return await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=env, pass_fds=fds,
        )
    except FileNotFoundError:
        raise SandboxError(f"{argv[0]} not found; install bubblewrap (apt-get install bubblewrap)") from None


async def _read_to_eof(fd: int) -> bytes:
    """Read a pipe to EOF without blocking the event loop."""
    loop = asyncio.get_running_loop()
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    done: asyncio.Future[None] = loop.create_future()

    def on_readable() -> None:
        try:
            while chunk := os.read(fd, 4096):
                chunks.append(chunk)
        except BlockingIOError:
            return
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, on_readable)
    try:
        await asyncio.wait_for(done, 30)
    finally:
        loop.remove_reader(fd)
    return b"".join(chunks)
