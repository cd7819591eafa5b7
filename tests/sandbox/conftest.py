"""Fixtures for the sandbox tests: real bubblewrap and local sandboxes, host process probes."""

from __future__ import annotations

import os
from collections import defaultdict

import pytest

from raas.sandbox import Limits
from raas.sandbox.bwrap import BwrapSandbox
from raas.sandbox.local import LocalSandbox


@pytest.fixture
async def bwrap_box(tmp_path):
    async with BwrapSandbox(limits=Limits(timeout=20), tmp_dir=str(tmp_path)) as box:
        yield box


@pytest.fixture
async def local_box(tmp_path):
    async with LocalSandbox(limits=Limits(timeout=20), tmp_dir=str(tmp_path)) as box:
        yield box


@pytest.fixture(params=["bwrap", "local"])
async def box(request, tmp_path):
    cls = {"bwrap": BwrapSandbox, "local": LocalSandbox}[request.param]
    async with cls(limits=Limits(timeout=20), tmp_dir=str(tmp_path)) as b:
        yield b


class HostProbe:
    """What the host sees of processes and memory (as a fixture: test modules cannot import
    conftest helpers reliably)."""

    @staticmethod
    def descendants(pid: int) -> dict[int, str]:
        return descendants(pid)

    @staticmethod
    def matching(text: str) -> dict[int, str]:
        """Live host processes whose command line contains ``text`` (orphans included)."""
        return {p: cmd for p, (_, state, cmd) in process_table().items() if text in cmd and state != "Z"}

    @staticmethod
    def alive(pid: int) -> bool:
        return alive(pid)

    @staticmethod
    def peak_rss_reset() -> None:
        peak_rss_reset()

    @staticmethod
    def peak_rss() -> int:
        return peak_rss()


@pytest.fixture
def host() -> type[HostProbe]:
    return HostProbe


def process_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (ppid, state, command line) for every host process."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        table[int(name)] = (int(fields[1]), fields[0], cmd)
    return table


def descendants(pid: int) -> dict[int, str]:
    """Live (non-zombie) descendants of ``pid`` on the host: pid -> command line."""
    table = process_table()
    children = defaultdict(list)
    for p, (ppid, _, _) in table.items():
        children[ppid].append(p)
    out, todo = {}, [pid]
    while todo:
        for c in children[todo.pop()]:
            if table[c][1] != "Z":
                out[c] = table[c][2]
            todo.append(c)
    return out


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def peak_rss_reset() -> None:
    """Reset this process's peak RSS (VmHWM) so that the next reading covers only what follows."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/self/status")
