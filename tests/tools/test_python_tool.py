"""The python tool on a real ipykernel inside a real bubblewrap sandbox."""

from __future__ import annotations

import asyncio
import socket

import pytest

from raas.agent.tools.base import Tool, schema
from raas.agent.tools.python import PythonTool


@pytest.fixture
async def python(sandbox):
    tool = PythonTool(sandbox, timeout=20, interrupt_grace=3)
    yield tool
    await tool.close()


async def run(tool: PythonTool, code: str, **kw) -> str:
    result = await tool({"code": code, **kw})
    assert result.ok, result.text
    return result.text


def test_schema(sandbox):
    tool = PythonTool(sandbox)
    assert isinstance(tool, Tool)
    fn = schema(tool)["function"]
    assert fn["name"] == "python" and fn["parameters"]["required"] == ["code"]


async def test_state_output_errors_and_interrupts(python):
    """One kernel through the common cases (a kernel takes a second or two to start)."""
    assert await run(python, "x = 21") == "[no output]"
    assert await run(python, "print('side', 'effect'); x * 2") == "side effect\n42"
    assert await run(python, "import os; os.getcwd(), os.getuid()") == "('/workspace', 1000)"  # sandboxed
    assert await run(python, "import sys; print('to stderr', file=sys.stderr)") == "to stderr"

    result = await python({"code": "def f():\n    return 1 / 0\nf()"})
    assert not result.ok and "ZeroDivisionError: division by zero" in result.text and "\x1b" not in result.text
    assert "----> 3 f()" in result.text  # the traceback points at the line

    result = await python({"code": "input('name? ')"})
    assert not result.ok and "StdinNotImplementedError" in result.text  # no hang waiting for input

    result = await python({"code": "import time\nprint('before')\ntime.sleep(300)", "timeout": 1})
    assert not result.ok and "before" in result.text and "KeyboardInterrupt" in result.text
    assert "timed out after 1s; interrupted" in result.text
    assert await run(python, "x") == "21"  # the interrupt kept the state

    result = await python({"code": "while True: pass", "timeout": 1})
    assert not result.ok and "KeyboardInterrupt" in result.text
    assert await run(python, "x + 1") == "22"


async def test_output_is_truncated(sandbox):
    tool = PythonTool(sandbox, max_output_chars=1000)
    try:
        text = await run(tool, "for i in range(100000): print(i)")
        assert text.startswith("0\n1\n2\n") and text.endswith("99998\n99999") and "characters cut" in text
        assert len(text) < 1100
    finally:
        await tool.close()


async def test_kernel_death_and_unresponsive_kernel_restart(python):
    await run(python, "y = 1")
    result = await python({"code": "import os; os._exit(3)"})
    assert not result.ok and "the kernel died (exit code 3)" in result.text
    assert "NameError" in (await python({"code": "y"})).text  # a fresh kernel
    result = await python({"code": "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(300)",
                           "timeout": 1})
    assert not result.ok and "did not respond to the interrupt and was restarted" in result.text
    assert await run(python, "1 + 1") == "2"


async def test_swapped_socket_paths_do_not_redirect_the_host(python, sandbox, tmp_path):
    """The sandbox controls the socket directory; the host stays on the sockets it pinned."""
    await run(python, "pid = __import__('os').getpid()")
    decoy = socket.socket(socket.AF_UNIX)
    decoy.bind(str(tmp_path / "decoy.sock"))
    decoy.listen(16)
    decoy.setblocking(False)
    scratch = sandbox.host_path(sandbox.scratch)
    sockets = [p for p in scratch.iterdir() if p.is_socket()]
    assert len(sockets) == 5
    for p in sockets:  # what a malicious command could do: replace each with a link to a host socket
        p.unlink()
        p.symlink_to(tmp_path / "decoy.sock")
    assert await run(python, "21 * 2") == "42"  # still talking to the kernel it started with
    kernel_pid = (await run(python, "pid")).strip()
    await sandbox.exec(["kill", "-9", kernel_pid])  # the host's sockets now try to reconnect
    await asyncio.sleep(1.0)
    with pytest.raises(BlockingIOError):
        decoy.accept()
    decoy.close()


async def test_bad_arguments(python):
    for args in ({}, {"code": 1}, {"code": "1", "timeout": 0}):
        result = await python(args)
        assert not result.ok and result.text.startswith("Error:")
