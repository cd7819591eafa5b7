"""What a tool is, for the agent loop: a name, a JSON schema, and an async call.

Tools raise nothing at the model: bad arguments or a failure come back as an error observation
(``ToolResult(ok=False)``) that the model reads on its next turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass
class ToolResult:
    text: str
    ok: bool = True
    done: bool = False  # True ends the episode (the `finish` tool)
    answer: str | None = None  # final answer carried by `finish`


@runtime_checkable
class Tool(Protocol):
    name: str
    description: str
    parameters: dict[str, Any]  # JSON schema of the arguments object

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult: ...


def schema(tool: Tool) -> dict[str, Any]:
    """OpenAI / Hermes function schema, as chat templates with tool support expect it."""
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


class FinishTool:
    """Ends the episode with an answer."""

    name = "finish"
    description = "Finish the task and submit the final answer."
    parameters = {
        "type": "object",
        "properties": {"answer": {"type": "string", "description": "the final answer"}},
        "required": ["answer"],
    }

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        answer = arguments.get("answer")
        if answer is None:
            return ToolResult("Error: finish needs an 'answer' argument", ok=False)
        return ToolResult(f"Submitted: {answer}", done=True, answer=str(answer))
