"""The bash tool on a real pty bash inside a real bubblewrap sandbox."""

from __future__ import annotations

import asyncio

import pytest

from raas.agent.tools.base import Tool, schema
from raas.agent.tools.bash import BashTool


@pytest.fixture
async def bash(sandbox):
    tool = BashTool(sandbox, timeout=10, interrupt_grace=2)
    yield tool
    await tool.close()


async def run(tool: BashTool, command: str, **kw) -> str:
    result = await tool({"command": command, **kw})
    assert result.ok, result.text
    return result.text


def test_schema(sandbox):
    tool = BashTool(sandbox)
    assert isinstance(tool, Tool)
    fn = schema(tool)["function"]
    assert fn["name"] == "bash" and fn["parameters"]["required"] == ["command"]
    assert set(fn["parameters"]["properties"]) == {"command", "timeout"}


async def test_output_and_exit_codes(bash):
    assert await run(bash, "echo hello") == "hello\n[exit code: 0]"
    assert await run(bash, "echo out; echo err >&2; (exit 42)") == "out\nerr\n[exit code: 42]"
    assert await run(bash, "false") == "[exit code: 1]"
    assert await run(bash, "echo -n no-newline") == "no-newline\n[exit code: 0]"
    assert await run(bash, "id -u; pwd") == "1000\n/workspace\n[exit code: 0]"  # inside the sandbox


async def test_state_persists_between_calls(bash):
    await run(bash, "mkdir -p /tmp/d && cd /tmp/d && export COLOR=blue && greet() { echo hi $1; }")
    assert await run(bash, 'pwd; echo "$COLOR"; greet you') == "/tmp/d\nblue\nhi you\n[exit code: 0]"
    await run(bash, "sleep 300 &")
    assert "Running" in await run(bash, "jobs")
    await run(bash, "kill %1; wait")
    assert await run(bash, "jobs") == "[exit code: 0]"


async def test_commands_with_awkward_text(bash):
    script = 'for i in 1 2; do\n  echo "line $i"\ndone\ncat <<EOF\nheredoc \'quoted\' "x"\nEOF'
    assert await run(bash, script) == "line 1\nline 2\nheredoc 'quoted' \"x\"\n[exit code: 0]"
    long = "echo " + "x" * 6000  # longer than the terminal's 4 KiB line buffer
    assert await run(bash, long) == "x" * 6000 + "\n[exit code: 0]"
    # Control characters in the command text are data, not keystrokes (no Ctrl-C, no Ctrl-D).
    dump = await run(bash, "echo 'a\x03b\x04c' | od -c | head -1")
    assert dump.split()[1:7] == ["a", "003", "b", "004", "c", "\\n"]
    assert await run(bash, "echo 'history! expansion!'") == "history! expansion!\n[exit code: 0]"


async def test_terminal_noise_is_cleaned(bash):
    assert await run(bash, r"printf '\033[31mred\033[0m\n'") == "red\n[exit code: 0]"
    assert await run(bash, r"printf 'progress 10%%\rprogress 100%%\n'") == "progress 100%\n[exit code: 0]"
    assert "\x1b" not in await run(bash, "ls --color=always /")


async def test_timeout_interrupts_and_keeps_the_shell(bash):
    await run(bash, "cd /tmp && KEEP=1")
    result = await bash({"command": "echo started; sleep 300", "timeout": 1})
    assert not result.ok and result.text == "started\n[timed out after 1s; interrupted, exit code: 130]"
    # A command that ignores SIGINT is killed (SIGKILL to the terminal's foreground group).
    result = await bash({"command": "bash -c \"trap '' INT; sleep 300\"", "timeout": 1})
    assert not result.ok and "interrupted, exit code: 137" in result.text
    assert await run(bash, 'echo "$PWD $KEEP"') == "/tmp 1\n[exit code: 0]"


async def test_output_is_truncated_head_and_tail(sandbox):
    tool = BashTool(sandbox, max_output_chars=1000)
    text = await run(tool, "seq 1 100000")
    head, _, tail = text.partition("characters cut ...]")
    assert head.startswith("1\n2\n3\n") and tail.endswith("99999\n100000\n[exit code: 0]")
    assert len(text) < 1100


async def test_exit_and_restart(bash):
    await run(bash, "cd /tmp")
    result = await bash({"command": "echo bye; exit 7"})
    assert "bye" in result.text and "the shell exited with code 7" in result.text
    assert await run(bash, "pwd") == "/workspace\n[exit code: 0]"  # a fresh shell


async def test_concurrent_calls_are_serialized(bash):
    a, b = await asyncio.gather(bash({"command": "sleep 0.3; echo first"}), bash({"command": "echo second"}))
    assert (a.text, b.text) == ("first\n[exit code: 0]", "second\n[exit code: 0]")


async def test_bad_arguments_are_errors_not_exceptions(bash):
    for args in ({}, {"command": ""}, {"command": 3}, {"command": "true", "timeout": -1}, {"command": "true", "timeout": "x"}):
        result = await bash(args)
        assert not result.ok and result.text.startswith("Error:")


async def test_dead_sandbox_is_an_error_result(sandbox):
    tool = BashTool(sandbox)
    await run(tool, "true")
    await sandbox.close()
    result = await tool({"command": "echo hi"})
    assert not result.ok and "sandbox" in result.text
