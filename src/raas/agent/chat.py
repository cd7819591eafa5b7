"""Token-exact chat rendering with the model's own chat template.

The conversation is rendered once at the start; after that we only *append*:

* the assistant's tokens exactly as sampled (never decoded and re-encoded);
* follow-up messages (tool results, user turns) rendered as the template renders them, together
  with the template glue that follows the assistant's end-of-turn token and the next generation
  prompt.

The follow-up delta is found by rendering a fixed dummy conversation with and without the new
messages and taking the string difference, which works for any template that renders a message
independently of the ones after it (ChatML, Llama 3, Qwen, Mistral ...).
"""

from __future__ import annotations

import bisect
import json
from typing import Any

_DUMMY_USER = {"role": "user", "content": "x"}
_DUMMY_ASSISTANT = {"role": "assistant", "content": "y"}


def template_supports_tools(tokenizer) -> bool:
    tpl = tokenizer.chat_template or ""
    return "tools" in tpl


def tools_system_text(tool_schemas: list[dict[str, Any]]) -> str:
    """Hermes-style tool description for templates that do not render ``tools`` themselves."""
    lines = "\n".join(json.dumps(s["function"]) for s in tool_schemas)
    return (
        "You may call tools. Their signatures, one JSON per line:\n<tools>\n"
        f"{lines}\n</tools>\n"
        "To call one, reply with <tool_call>{\"name\": <tool name>, \"arguments\": <args object>}</tool_call>."
    )


class ChatRenderer:
    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.native_tools = template_supports_tools(tokenizer)
        self.eos_text = tokenizer.eos_token or ""
        # The dummy conversation that follow-up messages are rendered after, and the glue the
        # template puts after an assistant's end-of-turn token (e.g. "\n"): fixed per template.
        self._base = tokenizer.apply_chat_template([_DUMMY_USER, _DUMMY_ASSISTANT], tokenize=False)
        cut = self._base.rfind(self.eos_text) if self.eos_text else -1
        self._glue = self._base[cut + len(self.eos_text) :] if cut >= 0 else ""

    # ----------------------------------------------------------------- initial prompt
    def prepare_messages(self, messages: list[dict], tool_schemas: list[dict]) -> list[dict]:
        """Put the tool description where the template cannot (into the system message)."""
        if not tool_schemas or self.native_tools:
            return messages
        text = tools_system_text(tool_schemas)
        if messages and messages[0]["role"] == "system":
            return [{**messages[0], "content": messages[0]["content"] + "\n\n" + text}] + messages[1:]
        return [{"role": "system", "content": text}] + messages

    def render(self, messages: list[dict], tool_schemas: list[dict] | None = None) -> list[int]:
        """Tokens of the whole initial conversation followed by the generation prompt."""
        return self.render_with_spans(messages, tool_schemas)[0]

    def render_with_spans(
        self, messages: list[dict], tool_schemas: list[dict] | None = None
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """``render`` plus the token span of each of ``messages`` in it, from one rendering.

        A span runs from the end of the previous message to the end of this one as the template
        renders it (so it includes the template's glue); an injected tool description belongs to
        the first span.
        """
        msgs = self.prepare_messages(messages, tool_schemas or [])
        kw = {"tools": tool_schemas} if (tool_schemas and self.native_tools) else {}
        full = self.tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False, **kw)
        enc = self.tok(full, add_special_tokens=False, return_offsets_mapping=True)
        ids = list(enc["input_ids"])
        starts = [a for a, _ in enc["offset_mapping"]]
        spans, prev = [], 0
        shift = len(msgs) - len(messages)
        for k in range(len(messages)):
            upto = self.tok.apply_chat_template(msgs[: k + 1 + shift], tokenize=False, **kw)
            end = bisect.bisect_left(starts, len(upto)) if full.startswith(upto) else len(ids)
            spans.append((prev, end))
            prev = end
        return ids, spans

    # ----------------------------------------------------------------- appending
    def continuation(self, messages: list[dict]) -> list[int]:
        """Tokens to append after a sampled assistant turn (which ended with its end-of-turn token):
        the template glue, ``messages`` rendered as the template renders them, and the next
        generation prompt."""
        full = self.tok.apply_chat_template(
            [_DUMMY_USER, _DUMMY_ASSISTANT, *messages], add_generation_prompt=True, tokenize=False
        )
        if not full.startswith(self._base):
            raise ValueError("chat template re-renders earlier messages; cannot append token-exactly")
        # The sampled turn stops right after its end-of-turn token, so the glue is ours to append.
        delta = self._glue + full[len(self._base) :]
        return list(self.tok.encode(delta, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)
