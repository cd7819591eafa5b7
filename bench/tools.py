"""``raas bench tools``: tool and sandbox latencies, each side by side with the usual alternative.

1. bash round trip (p50/p99) over a mix of short commands (echo, pwd, cd, variable
   assignment, ls): the pty ``BashTool`` (in a bubblewrap and in a local sandbox), a
   tmux-driven shell (send-keys, then capture-pane as fast as tmux answers until an end
   marker shows) and a fresh ``subprocess.run(["bash", "-c", cmd])`` per command.
2. sandbox start to first command (``start()`` + ``exec(["true"])``): bubblewrap, local, and
   Apptainer/Docker when installed (images from RAAS_BENCH_APPTAINER_IMAGE /
   RAAS_BENCH_DOCKER_IMAGE); as a reference, bubblewrap alone running /bin/true with the same
   mounts (what the machine charges for the namespaces themselves).
3. python round trip: the ``PythonTool`` kernel in a bubblewrap sandbox vs a fresh
   ``python -c`` per snippet.

Usage: python bench/tools.py [--rounds N] [--starts N] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import shutil
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from rich.console import Console
from rich.table import Table

from raas.agent.tools.bash import BashTool
from raas.agent.tools.python import PythonTool
from raas.sandbox import apptainer, docker, make_sandbox
from raas.sandbox.bwrap import BwrapSandbox

BASH_MIX = ["echo hello", "pwd", "cd /tmp", "X=42", "ls", "cd - >/dev/null", "echo $X"]
PY_MIX = ["1 + 1", "x = 3", "sum(range(1000))", "'ab' * 3"]


def stats(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    pick = lambda q: s[min(len(s) - 1, int(q * len(s)))] * 1000
    return {"n": len(s), "p50_ms": pick(0.50), "p99_ms": pick(0.99), "mean_ms": sum(s) / len(s) * 1000}


async def timed(n: int, step: Callable[[int], Awaitable[Any]]) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        await step(i)
        out.append(time.perf_counter() - t)
    return out


# -- bash ----------------------------------------------------------------------------------------
async def bash_tool(kind: str, rounds: int) -> list[float]:
    async with make_sandbox(kind) as box:
        tool = BashTool(box)
        for cmd in BASH_MIX:  # warm up (starts the shell)
            assert (await tool({"command": cmd})).ok

        async def step(i: int) -> None:
            result = await tool({"command": BASH_MIX[i % len(BASH_MIX)]})
            assert result.ok, result.text

        return await timed(rounds, step)


class TmuxShell:
    """A shell in a detached tmux session, driven the way tmux-based agent harnesses do it."""

    def __init__(self) -> None:
        self.sock = f"raas-bench-{secrets.token_hex(4)}"
        self.n = 0
        self._tmux("new-session", "-d", "-s", "bench", "-x", "200", "-y", "50", "bash --norc --noprofile")

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.sock, *args], capture_output=True, text=True, check=True).stdout

    def run(self, cmd: str) -> str:
        self.n += 1
        # Quotes split the marker so that the echoed command line does not contain it.
        self._tmux("send-keys", "-t", "bench", f'{cmd}; echo "__DO""NE_{self.n}_$?__"', "Enter")
        while f"__DONE_{self.n}_" not in (screen := self._tmux("capture-pane", "-p", "-t", "bench", "-S", "-60")):
            pass
        return screen

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.sock, "kill-server"], capture_output=True)


async def tmux_shell(rounds: int) -> list[float]:
    shell = TmuxShell()
    try:
        for cmd in BASH_MIX:
            shell.run(cmd)

        async def step(i: int) -> None:
            shell.run(BASH_MIX[i % len(BASH_MIX)])

        return await timed(rounds, step)
    finally:
        shell.close()


async def fresh_subprocess(rounds: int) -> list[float]:
    async def step(i: int) -> None:
        subprocess.run(["bash", "-c", BASH_MIX[i % len(BASH_MIX)]], capture_output=True, check=True)

    return await timed(rounds, step)


# -- sandbox start -------------------------------------------------------------------------------
async def first_command(kind: str, n: int, **opts: Any) -> list[float]:
    out = []
    for _ in range(n):
        box = make_sandbox(kind, **opts)
        t = time.perf_counter()
        await box.start()
        result = await box.exec(["true"])
        out.append(time.perf_counter() - t)
        await box.close()
        assert result.exit_code == 0
    return out


async def bwrap_alone(n: int) -> list[float]:
    """Reference: the same bubblewrap mounts running /bin/true, no agent and no user mapping."""
    box = BwrapSandbox()
    box.map_user = False
    box._make_layout()
    try:
        (box.root / "passwd").write_text("")
        (box.root / "group").write_text("")
        argv = box.bwrap_argv()
        argv = [*argv[: argv.index("--chdir") + 2], "/bin/true"]

        async def step(i: int) -> None:
            subprocess.run(argv, check=True)

        return await timed(n, step)
    finally:
        await box.close()


# -- python --------------------------------------------------------------------------------------
async def python_tool(rounds: int) -> list[float]:
    async with make_sandbox("bwrap") as box:
        tool = PythonTool(box)
        try:
            for code in PY_MIX:
                assert (await tool({"code": code})).ok

            async def step(i: int) -> None:
                result = await tool({"code": PY_MIX[i % len(PY_MIX)]})
                assert result.ok, result.text

            return await timed(rounds, step)
        finally:
            await tool.close()


async def python_c(rounds: int) -> list[float]:
    async def step(i: int) -> None:
        snippet = PY_MIX[i % len(PY_MIX)]
        code = snippet if "=" in snippet else f"print(repr({snippet}))"  # show the value, as the kernel does
        subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)

    return await timed(rounds, step)


# -- driver --------------------------------------------------------------------------------------
async def run(args: argparse.Namespace, console: Console) -> dict[str, dict[str, dict[str, float]]]:
    results: dict[str, dict[str, dict[str, float]]] = {"bash round trip": {}, "sandbox start to first command": {},
                                                        "python round trip": {}}
    bash, start, py = results.values()
    console.print("bash round trip ...")
    bash["BashTool, pty (bwrap sandbox)"] = stats(await bash_tool("bwrap", args.rounds))
    bash["BashTool, pty (local sandbox)"] = stats(await bash_tool("local", args.rounds))
    if shutil.which("tmux"):
        bash["tmux send-keys + capture-pane"] = stats(await tmux_shell(max(20, args.rounds // 5)))
    bash["fresh subprocess.run per command"] = stats(await fresh_subprocess(max(20, args.rounds // 5)))
    console.print("sandbox start ...")
    start["bubblewrap"] = stats(await first_command("bwrap", args.starts))
    start["(reference: bwrap alone, same mounts, /bin/true)"] = stats(await bwrap_alone(args.starts))
    start["local (no isolation)"] = stats(await first_command("local", args.starts))
    if apptainer.available():
        image = os.environ.get("RAAS_BENCH_APPTAINER_IMAGE", "docker://debian:bookworm-slim")
        start[f"apptainer ({image})"] = stats(await first_command("apptainer", max(5, args.starts // 10), image=image))
    if docker.available():
        image = os.environ.get("RAAS_BENCH_DOCKER_IMAGE", "debian:bookworm-slim")
        start[f"docker ({image})"] = stats(await first_command("docker", max(5, args.starts // 10), image=image))
    console.print("python round trip ...")
    py["PythonTool, ipykernel (bwrap sandbox)"] = stats(await python_tool(args.rounds))
    py["fresh python -c per snippet"] = stats(await python_c(max(10, args.rounds // 10)))
    return results


def render(results: dict[str, dict[str, dict[str, float]]], console: Console) -> None:
    for title, rows in results.items():
        table = Table(title=title)
        for col in ("method", "n", "p50 ms", "p99 ms", "mean ms"):
            table.add_column(col, justify="left" if col == "method" else "right")
        for name, s in rows.items():
            table.add_row(name, str(s["n"]), f"{s['p50_ms']:.3f}", f"{s['p99_ms']:.3f}", f"{s['mean_ms']:.3f}")
        console.print(table)


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0], "euid": os.geteuid(),
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="raas bench tools", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=300, help="calls per round-trip measurement (default 300)")
    ap.add_argument("--starts", type=int, default=100, help="sandboxes started per kind (default 100)")
    ap.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    console = Console()
    info = machine()
    results = asyncio.run(run(args, console))
    info["load_average_1m_after"] = os.getloadavg()[0]
    render(results, console)
    console.print(f"machine: {info}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": info, "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
