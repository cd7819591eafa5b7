"""A calculator tool: safe arithmetic over Python's AST. Model text is never passed to eval()."""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from raas.agent.tools.base import ToolResult

_BIN = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UN = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_ABS = 10**18
_MAX_EXPR = 200


class CalcError(ValueError):
    pass


def evaluate(expr: str) -> int | float:
    """Evaluate + - * / // % ** and parentheses on numbers. Raises CalcError on anything else."""
    if len(expr) > _MAX_EXPR:
        raise CalcError(f"expression longer than {_MAX_EXPR} characters")
    expr = expr.replace("×", "*").replace("÷", "/").replace("^", "**")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        raise CalcError(f"cannot parse {expr!r}") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        a, b = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and (abs(b) > 64 or abs(a) > 10**6):
            raise CalcError("exponent too large")
        try:
            v = _BIN[type(node.op)](a, b)
        except ZeroDivisionError:
            raise CalcError("division by zero") from None
        if isinstance(v, complex) or (isinstance(v, float) and not math.isfinite(v)) or abs(v) > _MAX_ABS:
            raise CalcError("result out of range")
        return v
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UN:
        return _UN[type(node.op)](_eval(node.operand))
    raise CalcError(f"unsupported element {type(node).__name__}; use numbers and + - * / // % ** ( )")


def format_number(v: int | float) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(round(v, 10)) if isinstance(v, float) else str(v)


class CalculatorTool:
    name = "calculator"
    description = "Evaluate an arithmetic expression (numbers, + - * / // % ** and parentheses)."
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 23*41"}},
        "required": ["expression"],
    }

    async def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        expr = arguments.get("expression")
        if not isinstance(expr, str):
            return ToolResult("Error: calculator needs a string argument 'expression'", ok=False)
        try:
            return ToolResult(format_number(evaluate(expr)))
        except CalcError as e:
            return ToolResult(f"Error: {e}", ok=False)
