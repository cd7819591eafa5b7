"""The standard agent loop with SmolLM2's real tokenizer and chat template.

The inference client here is scripted (it answers with fixed texts, tokenised by the real
tokenizer), because these tests are about the loop's token bookkeeping in isolation; the loop
against the real engine is covered in test_service.py.
"""

from __future__ import annotations

import pytest

from raas.agent.chat import ChatRenderer
from raas.agent.loop import run_agent
from raas.agent.parsing import parse_tool_calls
from raas.agent.tools.base import schema
from raas.agent.tools.calculator import CalculatorTool, CalcError, evaluate
from raas.contracts import AgentConfig, GenerateResponse, SamplingParams, Status


class ScriptedClient:
    """Answers turn k with script[k] (text + end-of-turn), recording every prompt it saw."""

    def __init__(self, tokenizer, script: list[str], version: int = 7):
        self.tok, self.script, self.version = tokenizer, list(script), version
        self.prompts: list[list[int]] = []

    async def generate(self, prompt_token_ids, sampling):
        self.prompts.append(list(prompt_token_ids))
        text = self.script.pop(0)
        ids = self.tok.encode(text, add_special_tokens=False)[: sampling.max_tokens]
        finish = "length"
        if len(ids) < sampling.max_tokens:
            ids = ids + [self.tok.eos_token_id]
            finish = "stop"
        return GenerateResponse(
            output_token_ids=ids, logprobs=[-0.5] * len(ids), version=self.version, finish_reason=finish
        )


MESSAGES = [
    {"role": "system", "content": "Use the calculator."},
    {"role": "user", "content": "A box holds 12 pens. How many pens are in 34 boxes?"},
]
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>'


async def _run(tokenizer, script, agent=None, max_model_len=4096, sampling=None):
    client = ScriptedClient(tokenizer, script)
    ep = await run_agent(
        client, ChatRenderer(tokenizer), MESSAGES, [CalculatorTool()],
        sampling or SamplingParams(max_tokens=64), agent or AgentConfig(max_turns=4), max_model_len,
    )
    return client, ep


async def test_assistant_spans_decode_to_turn_text_and_prompts_only_append(tokenizer):
    client, ep = await _run(tokenizer, [CALL, "Answer: 408"])
    assert ep.status == Status.completed and ep.stop_reason == "answer"
    assistant = [t for t in ep.turns if t.sampled]
    assert all(t.role == "assistant" for t in assistant)
    assert [t.text for t in assistant] == [CALL, "Answer: 408"]
    for t in assistant:
        a, b = t.span
        assert tokenizer.decode(ep.tokens[a:b], skip_special_tokens=True) == t.text
        assert all(ep.loss_mask[a:b]) and set(ep.versions[a:b]) == {7}
    assert assistant[0].tool_calls[0].name == "calculator"
    # Append-only: each turn's prompt is a prefix of the next one and of the final tokens.
    assert len(client.prompts) == 2
    assert client.prompts[1][: len(client.prompts[0])] == client.prompts[0]
    assert ep.tokens[: len(client.prompts[1])] == client.prompts[1]
    # The tool result is rendered exactly as the chat template renders a tool message.
    tool_turn = next(t for t in ep.turns if t.role == "tool")
    assert tool_turn.text == "408"
    a, b = tool_turn.span
    assert tokenizer.decode(ep.tokens[a:b]) == "\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"
    assert not any(ep.loss_mask[a:b]) and set(ep.versions[a:b]) == {-1}
    # The whole episode is token for token the template's own rendering of the same conversation.
    renderer = ChatRenderer(tokenizer)
    convo = renderer.prepare_messages(MESSAGES, [schema(CalculatorTool())]) + [
        {"role": "assistant", "content": CALL}, {"role": "tool", "content": "408"}, {"role": "assistant", "content": "Answer: 408"}
    ]
    rendered = tokenizer.apply_chat_template(convo, tokenize=True, return_dict=False)
    assert ep.tokens + tokenizer.encode("\n", add_special_tokens=False) == list(rendered)


async def test_malformed_tool_call_becomes_error_observation(tokenizer):
    client, ep = await _run(tokenizer, ["<tool_call>{not json}</tool_call>", "Answer: 408"])
    assert ep.status == Status.completed
    tool = next(t for t in ep.turns if t.role == "tool")
    assert tool.text.startswith("Error: tool call is not valid JSON")
    assert ep.tool_errors == 1 and ep.tool_calls == 0


async def test_unknown_tool_and_bad_arguments_are_observations(tokenizer):
    script = ['<tool_call>{"name": "shell", "arguments": {}}</tool_call>',
              '<tool_call>{"name": "calculator", "arguments": {"expression": "__import__(\'os\')"}}</tool_call>',
              "Answer: 1"]
    _, ep = await _run(tokenizer, script)
    tools = [t.text for t in ep.turns if t.role == "tool"]
    assert "unknown tool 'shell'" in tools[0]
    assert tools[1].startswith("Error: unsupported element")
    assert ep.tool_errors == 2


async def test_max_turns_truncates(tokenizer):
    _, ep = await _run(tokenizer, [CALL, CALL], agent=AgentConfig(max_turns=2))
    assert ep.status == Status.truncated and ep.stop_reason == "max_turns"
    assert ep.num_turns == 2


async def test_turn_cut_by_max_tokens_truncates(tokenizer):
    _, ep = await _run(tokenizer, ["Let me think about this for a long long long time indeed"], sampling=SamplingParams(max_tokens=4))
    assert ep.status == Status.truncated and ep.stop_reason == "turn_length"
    assert sum(ep.loss_mask) == 4


async def test_context_length_and_total_token_limits_truncate(tokenizer):
    prompt_len = len(ChatRenderer(tokenizer).render(MESSAGES, [schema(CalculatorTool())]))
    _, ep = await _run(tokenizer, ["Answer"], max_model_len=prompt_len // 2)
    assert ep.status == Status.truncated and ep.stop_reason == "context" and sum(ep.loss_mask) == 0
    # Room for the tool call but not for its result: the episode stops before the observation.
    _, ep = await _run(tokenizer, [CALL, "Answer: 408"], agent=AgentConfig(max_turns=4, max_total_tokens=prompt_len + 40))
    assert ep.status == Status.truncated and ep.stop_reason == "max_tokens"
    assert ep.num_turns == 1 and len(ep.tokens) <= prompt_len + 40
    # Room for only part of a turn: the turn is cut by the context budget.
    _, ep = await _run(tokenizer, [CALL], agent=AgentConfig(max_turns=4, max_total_tokens=prompt_len + 5))
    assert ep.status == Status.truncated and ep.stop_reason == "context" and sum(ep.loss_mask) == 5


def test_parse_tool_calls_formats():
    p = parse_tool_calls('ok <tool_call>{"name": "a", "arguments": {"x": 1}}</tool_call>')
    assert [c.name for c in p.calls] == ["a"] and p.content == "ok"
    p = parse_tool_calls('<tool_call>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": "{\\"y\\": 2}"}]</tool_call>')
    assert [c.name for c in p.calls] == ["a", "b"] and p.calls[1].arguments == {"y": 2}
    p = parse_tool_calls('<tool_call>{"name": "a"')
    assert p.errors == ["tool call is not closed with </tool_call>"] and not p.calls
    p = parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')
    assert p.errors == ["tool call needs a string 'name'"]
    assert not parse_tool_calls("Answer: 5").has_calls


@pytest.mark.parametrize("expr,value", [("12*34", 408), ("(2+3)**2", 25), ("7/2", 3.5), ("-4 + 10 // 3", -1), ("3×4", 12)])
def test_calculator_evaluates(expr, value):
    assert evaluate(expr) == value


@pytest.mark.parametrize("expr", ["__import__('os')", "open('x')", "2**100000", "1/0", "a+1", "[1]*3", "9" * 300])
def test_calculator_rejects_anything_else(expr):
    with pytest.raises(CalcError):
        evaluate(expr)
