"""The calculator environment: deterministic tasks, validation, and scoring of real episodes."""

from __future__ import annotations

import pytest

from raas.agent.chat import ChatRenderer
from raas.contracts import AgentConfig, SamplingParams
from raas.envs.base import RunContext, TaskError
from raas.envs.calculator import CalculatorEnv, generate, parse_answer
from tests.test_agent import ScriptedClient


def test_tasks_are_deterministic_per_seed():
    assert generate(7) == generate(7)
    assert generate(7) != generate(8)
    p = generate(7)
    a, b = map(int, p["expression"].split("*"))
    assert p["answer"] == a * b and 11 <= a <= 99 and str(a) in p["question"]


@pytest.mark.parametrize(
    "instance,field",
    [({}, "seed"), ({"seed": "x"}, "seed"), ({"seed": 1, "digits": 9}, "digits"), ({"question": "q"}, "answer")],
)
def test_bad_instances_name_the_field(instance, field):
    with pytest.raises(TaskError) as e:
        CalculatorEnv().validate(instance)
    assert e.value.field == field and str(e.value).startswith(f"task.{field}:")


def test_parse_answer_takes_the_last_answer():
    assert parse_answer("Answer: 12") == 12
    assert parse_answer("Answer: 1,776. Actually Answer: 1776") == 1776
    assert parse_answer("the answer is 5") is None


@pytest.mark.parametrize(
    "script,reward,metrics",
    [
        (["EXPR_CALL", "Answer: ANSWER"], 1.0, {"tool_called": True, "right_expression": True, "correct": True}),
        (["EXPR_CALL", "Answer: 1"], 0.0, {"tool_called": True, "right_expression": True, "correct": False}),
        (["Answer: ANSWER"], 1.0, {"tool_called": False, "correct": True}),
        (["I don't know"], 0.0, {"answered": False, "correct": False}),
    ],
)
async def test_episodes_are_scored(tokenizer, script, reward, metrics):
    env = CalculatorEnv()
    ep = await env.init({"seed": 3})
    expr, ans = ep.state["expression"], ep.state["answer"]
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>' % expr
    script = [s.replace("EXPR_CALL", call).replace("ANSWER", str(ans)) for s in script]
    ctx = RunContext(ScriptedClient(tokenizer, script), ChatRenderer(tokenizer), SamplingParams(max_tokens=64),
                     AgentConfig(max_turns=3), 4096)
    result = await env.run(ep, ctx)
    r, m = await env.eval(ep, result)
    assert r == reward
    for k, v in metrics.items():
        assert m[k] == v, k
    if metrics.get("tool_called"):
        assert any(t.role == "tool" and t.text == str(ans) for t in result.turns)
