"""The standard multi-turn agent loop, token-exact.

One episode: render the conversation once, then repeat {sample an assistant turn; parse tool
calls; run them; append their results} until the model answers without a tool call, calls
``finish``, or a limit ends it. ``tokens`` only ever grows by appending, so the prompt of turn k
is a prefix of the prompt of turn k+1 and nothing is re-tokenised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from raas.agent.chat import ChatRenderer
from raas.agent.parsing import parse_tool_calls
from raas.agent.tools.base import Tool, ToolResult, schema
from raas.contracts import AgentConfig, SamplingParams, Status, ToolCall, Turn
from raas.contracts.protocols import InferenceClient


@dataclass
class EpisodeResult:
    tokens: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    status: Status = Status.completed
    stop_reason: str = ""  # why the loop ended: answer, finish, max_turns, max_tokens, context, turn_length
    final_text: str = ""  # last assistant text (tool calls stripped)
    answer: str | None = None  # set by the finish tool
    num_turns: int = 0  # assistant turns sampled
    tool_calls: int = 0
    tool_errors: int = 0

    def append(self, ids: list[int], *, sampled: bool, logprobs=None, version: int = -1) -> tuple[int, int]:
        start = len(self.tokens)
        self.tokens += ids
        self.loss_mask += [1 if sampled else 0] * len(ids)
        self.logprobs += list(logprobs) if sampled else [0.0] * len(ids)
        self.versions += [version if sampled else -1] * len(ids)
        return start, len(self.tokens)


async def run_agent(
    client: InferenceClient,
    renderer: ChatRenderer,
    messages: list[dict[str, Any]],
    tools: list[Tool],
    sampling: SamplingParams,
    agent: AgentConfig,
    max_model_len: int,
    *,
    describe_tools: bool = True,
) -> EpisodeResult:
    """Run one episode. ``describe_tools=False`` leaves tool schemas out of the prompt (for
    environments whose messages already teach the tools, e.g. by worked examples)."""
    by_name = {t.name: t for t in tools}
    schemas = [schema(t) for t in tools] if describe_tools else []
    ep = EpisodeResult()
    prompt, spans = renderer.render_with_spans(messages, schemas)
    ep.append(prompt, sampled=False)
    for msg, span in zip(messages, spans):
        ep.turns.append(Turn(role=msg["role"], text=msg.get("content") or "", span=span))
    limit = min(max_model_len, agent.max_total_tokens or max_model_len)
    if len(ep.tokens) >= limit:
        return _end(ep, Status.truncated, "context")

    for turn in range(agent.max_turns):
        budget = min(sampling.max_tokens, limit - len(ep.tokens))
        gen = await client.generate(ep.tokens, sampling.model_copy(update={"max_tokens": budget}))
        span = ep.append(gen.output_token_ids, sampled=True, logprobs=gen.logprobs, version=gen.version)
        ep.num_turns += 1
        text = renderer.decode(gen.output_token_ids)
        parsed = parse_tool_calls(text)
        ep.turns.append(Turn(role="assistant", text=text, tool_calls=parsed.calls, span=span, sampled=True))
        ep.final_text = parsed.content
        if gen.finish_reason != "stop":
            # Cut mid-turn: by the per-turn budget, or by the episode / context limit.
            return _end(ep, Status.truncated, "turn_length" if budget == sampling.max_tokens else "context")
        if not parsed.has_calls:
            return _end(ep, Status.completed, "answer")

        results: list[tuple[str, ToolResult]] = []
        for err in parsed.errors:
            results.append(("error", ToolResult(f"Error: {err}", ok=False)))
        for call in parsed.calls:
            results.append((call.name, await _call(by_name, call)))
        ep.tool_calls += len(parsed.calls)
        ep.tool_errors += sum(not r.ok for _, r in results)
        done = next((r for _, r in results if r.done), None)
        if done is not None:
            ep.answer = done.answer
            return _end(ep, Status.completed, "finish")
        if turn == agent.max_turns - 1:
            return _end(ep, Status.truncated, "max_turns")

        tool_msgs = [{"role": "tool", "name": name, "content": _clip(r.text, agent.max_tool_output_chars)} for name, r in results]
        obs = renderer.continuation(tool_msgs)
        if len(ep.tokens) + len(obs) >= limit:
            return _end(ep, Status.truncated, "max_tokens" if agent.max_total_tokens else "context")
        span = ep.append(obs, sampled=False)
        for m in tool_msgs:
            ep.turns.append(Turn(role="tool", text=m["content"], span=span))
    return _end(ep, Status.truncated, "max_turns")


async def _call(by_name: dict[str, Tool], call: ToolCall) -> ToolResult:
    tool = by_name.get(call.name)
    if tool is None:
        return ToolResult(f"Error: unknown tool {call.name!r}; available: {', '.join(sorted(by_name))}", ok=False)
    try:
        return await tool(call.arguments)
    except Exception as e:  # a tool bug is an observation for the model, not a crashed episode
        return ToolResult(f"Error: {call.name} failed: {type(e).__name__}: {e}", ok=False)


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def _end(ep: EpisodeResult, status: Status, reason: str) -> EpisodeResult:
    ep.status = status
    ep.stop_reason = reason
    return ep
