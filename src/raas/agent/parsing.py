"""Tool-call parsing in the model's own format.

Hermes / Qwen / SmolLM2 style: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one
call per block, or a JSON list of calls inside one block. A block that does not parse is returned
as an error (and becomes an error observation for the model), never an exception.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from raas.contracts import ToolCall

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)


@dataclass
class ParsedOutput:
    content: str  # the text outside tool-call blocks
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # one message per malformed block

    @property
    def has_calls(self) -> bool:
        return bool(self.calls or self.errors)


def parse_tool_calls(text: str) -> ParsedOutput:
    calls: list[ToolCall] = []
    errors: list[str] = []
    for m in _BLOCK.finditer(text):
        raw = m.group(1).strip()
        if not m.group(0).endswith("</tool_call>"):
            errors.append("tool call is not closed with </tool_call>")
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            errors.append(f"tool call is not valid JSON ({e.msg} at char {e.pos})")
            continue
        for item in obj if isinstance(obj, list) else [obj]:
            err = _check(item)
            if err:
                errors.append(err)
            else:
                args = item.get("arguments", item.get("parameters", {}))
                if isinstance(args, str):  # some models emit arguments as a JSON string
                    try:
                        args = json.loads(args)
                    except json.JSONDecodeError:
                        errors.append("tool call 'arguments' is a string that is not a JSON object")
                        continue
                if not isinstance(args, dict):
                    errors.append("tool call 'arguments' must be a JSON object")
                    continue
                calls.append(ToolCall(name=item["name"], arguments=args))
    content = _BLOCK.sub("", text).strip()
    return ParsedOutput(content=content, calls=calls, errors=errors)


def _check(item) -> str | None:
    if not isinstance(item, dict):
        return "tool call must be a JSON object with 'name' and 'arguments'"
    if not isinstance(item.get("name"), str) or not item["name"]:
        return "tool call needs a string 'name'"
    return None


def format_tool_call(call: ToolCall) -> str:
    """Render one call the way the model is expected to write it (used for few-shot examples)."""
    return "<tool_call>" + json.dumps({"name": call.name, "arguments": call.arguments}) + "</tool_call>"
