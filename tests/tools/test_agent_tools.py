"""The sandbox tools inside the standard agent loop: schemas shown to the model the way its chat
template expects, calls parsed from the model's output, results appended as tool messages."""

from __future__ import annotations

import json

from raas.agent.chat import ChatRenderer
from raas.agent.loop import run_agent
from raas.agent.tools.base import FinishTool
from raas.agent.tools.bash import BashTool
from raas.agent.tools.edit import EditTool
from raas.contracts import AgentConfig, SamplingParams, Status
from tests.test_agent import ScriptedClient


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


async def test_agent_loop_drives_bash_edit_and_finish_in_a_sandbox(sandbox, tokenizer):
    bash = BashTool(sandbox, timeout=10)
    tools = [bash, EditTool(sandbox), FinishTool()]
    script = [
        call("edit", command="create", path="hello.py", file_text="print(6 * 7)\n"),
        call("bash", command="cd /workspace 2>/dev/null || true; python3 hello.py"),
        call("bash", command="cat /etc/shadow"),
        call("finish", answer="42"),
    ]
    client = ScriptedClient(tokenizer, script)
    try:
        ep = await run_agent(
            client, ChatRenderer(tokenizer), [{"role": "user", "content": "Print 6*7 with a script."}],
            tools, SamplingParams(max_tokens=200), AgentConfig(max_turns=6), 4096,
        )
    finally:
        await bash.close()
    assert ep.status == Status.completed and ep.stop_reason == "finish" and ep.answer == "42"
    # SmolLM2's template has no `tools` support: the schemas went into the system message.
    prompt = tokenizer.decode(client.prompts[0])
    assert "<tools>" in prompt and '"name": "bash"' in prompt and '"name": "edit"' in prompt
    observations = [t.text for t in ep.turns if t.role == "tool"]
    assert "42" in observations[1]
    assert "Permission denied" in observations[2] or "No such file" in observations[2]
    assert ep.tool_calls == 4
