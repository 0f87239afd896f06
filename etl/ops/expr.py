"""Expr: a new number column from an arithmetic expression over number columns, for the one-liners a pipeline needs
(``{op: Expr, out: ratio, expr: "I1 / (I2 + 1)"}``).

The expression is parsed with Python's ``ast`` module and checked against a short list of node types; nothing of
it is ever compiled or run as Python. What it may hold:

- column names (number columns: label, dense, and those ops create; the label only when ``out`` is the label), or
  ``col("a name")`` for a name that is no Python identifier; numbers (``2``, ``0.5``, ``1e-3``);
- ``+ - * /``, unary ``-``, parentheses; ``x ** n`` with ``n`` an integer from -16 to 16 (``x * x * ...``, the
  same bits on every backend; ``sqrt(x)`` for ``x ** 0.5``);
- functions ``abs(x)``, ``sqrt(x)``, ``log1p(x)``, ``min(a, b)``, ``max(a, b)`` (NaN when either is NaN) and
  ``where(condition, a, b)``: ``a`` where the condition holds, else ``b``; a condition compares numbers (``< <= >
  >= == !=``, chained as in Python: ``0 < x <= 1``) and combines comparisons with ``and``, ``or``, ``not``.

Values are computed in float64 and written as float32 at the end of the pipeline, like every number column.
Missing values: the result of a row is missing when a column the expression reads is missing in that row (as SQL's
NULL propagates; fill them first with FillMissing for a value), whatever branch ``where`` takes. A row whose
result is NaN or infinite (a division by zero, ``sqrt`` of a negative number) is invalid: the pipeline's output
check refuses it (``RowError``, or the row is quarantined), as for every op.

``columns`` may be left out: the op reads the columns its expression names. When given, it must name the same
columns. ``out`` names the output column: a new column (after the schema's columns in the output), or one of the
columns the expression reads (replaced). Every backend gives the same bits but for ``log1p``, whose last float64
bit may differ as ``Log1p``'s does (``etl.backends.tensor``).
"""

from __future__ import annotations

import ast
from typing import Any, TypeAlias

import numpy as np

from etl.backends import Array, Backend, cpu
from etl.batch import Batch, Column
from etl.ops.base import Op
from etl.schema import ColumnSpec

#: The tree evaluated: a number, a column (``("col", name)``) or a backend function applied to its arguments
#: (``("add", a, b)``: ``xp.elementwise("add", a, b)``).
Node: TypeAlias = "float | tuple[Any, ...]"

MAX_LENGTH = 2_000
MAX_DEPTH = 64
MAX_POWER = 16
_BINARY = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}
_COMPARE = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
#: the functions an expression may call, by their number of arguments
FUNCTIONS = {"abs": 1, "sqrt": 1, "log1p": 1, "min": 2, "max": 2, "where": 3, "col": 1}


class Expr(Op):
    """``out`` = the expression ``expr`` over number columns (see the module docstring)."""

    name = "Expr"

    def __init__(self, columns: list[str], out: Any, expr: Any):
        super().__init__(columns)
        if not isinstance(out, str) or not out:
            raise ValueError(f"Expr.out must be the name of the output column, got {out!r}")
        self.out, self.expr = out, expr
        self.tree, names = parse(expr)
        if sorted(set(columns)) != sorted(names):
            raise ValueError(f"Expr reads the columns its expr names ({', '.join(names)}); columns names {columns}: leave columns out")
        self.columns = names

    @classmethod
    def implied_columns(cls, params: dict[str, Any]) -> Any:
        """The columns ``expr`` names, in the order it first names them."""
        return parse(params.get("expr"))[1]

    def bind(self, specs: dict[str, ColumnSpec]) -> None:
        """Also refuse an expression that reads the label into another column: that column would be a feature made
        of the row's own target (a leak), and absent at serving time. The label itself may be rewritten
        (``out: label``, e.g. ``where(label >= 4, 1, 0)``)."""
        super().bind(specs)
        labels = [c for c, spec in self.specs.items() if spec.role == "label"]
        if labels and self.out not in labels:
            raise ValueError(f"Expr reads the label '{labels[0]}' into '{self.out}': a feature made of the row's own target; "
                             f"only the label itself may be rewritten from it (out: {labels[0]})")

    @property
    def outputs(self) -> list[str]:
        return [self.out]

    def transform(self, batch: Batch, xp: Backend) -> dict[str, Column]:
        cols = {c: xp.elementwise("float64", batch[c].values) for c in self.columns}
        valid = None
        for c in self.columns:
            v = batch[c].valid
            if v is not None:
                valid = v if valid is None else xp.elementwise("and", valid, v)
        return {self.out: Column(_evaluate(self.tree, cols, xp), valid)}


def _evaluate(node: Node, cols: dict[str, Array], xp: Backend) -> Any:
    if isinstance(node, float):
        return node
    if node[0] == "col":
        return cols[node[1]]
    return xp.elementwise(node[0], *(_evaluate(a, cols, xp) for a in node[1:]))


def parse(text: Any) -> tuple[Node, list[str]]:
    """The tree of the expression ``text`` and the columns it names (in order of first mention); ``ValueError``
    saying what is wrong (the part of the text at fault)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"Expr.expr must be an expression such as \"I1 / (I2 + 1)\", got {text!r}")
    if len(text) > MAX_LENGTH:
        raise ValueError(f"Expr.expr is {len(text)} characters long, more than {MAX_LENGTH}")
    try:
        body = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, RecursionError, MemoryError, ValueError) as e:
        raise ValueError(f"Expr.expr {text!r} is not an expression: {getattr(e, 'msg', e)}") from None
    names: list[str] = []
    tree = _Parser(text.strip(), names).number(body, 0)
    if not names:
        raise ValueError(f"Expr.expr {text!r} names no column")
    return tree, names


class _Parser:
    """Turns the ``ast`` of an expression into a ``Node`` tree, refusing every node type it does not know."""

    def __init__(self, text: str, names: list[str]):
        self.text, self.names = text, names

    def fail(self, node: ast.AST, problem: str) -> ValueError:
        part = ast.get_source_segment(self.text, node)
        return ValueError(f"Expr.expr {self.text!r}: {problem}" + (f": {part!r}" if part and part != self.text else ""))

    def number(self, node: ast.AST, depth: int) -> Node:
        """A number node (an array or a float)."""
        if depth > MAX_DEPTH:
            raise self.fail(node, f"nested more than {MAX_DEPTH} levels")
        d = depth + 1
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return _finite(float(node.value), self.fail(node, "not a finite float64 number"))
        if isinstance(node, ast.Name):
            return self.column(node.id)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            x = self.number(node.operand, d)
            return x if isinstance(node.op, ast.UAdd) else _fold("neg", x)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = self.number(node.left, d), self.number(node.right, d)
            return _fold(_BINARY[type(node.op)], left, right, error=self.fail(node, "a constant part is not finite"))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            return self.power(node, d)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS:
            return self.call(node, node.func.id, d)
        if isinstance(node, (ast.Compare, ast.BoolOp)) or isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            raise self.fail(node, "a condition is not a number (conditions go in where(condition, a, b))")
        raise self.fail(node, f"not allowed (numbers, columns, + - * / **, and {', '.join(f for f in FUNCTIONS if f != 'col')})")

    def column(self, name: str) -> Node:
        if name not in self.names:
            self.names.append(name)
        return ("col", name)

    def power(self, node: ast.BinOp, depth: int) -> Node:
        base = self.number(node.left, depth)
        n = self.number(node.right, depth)
        if not isinstance(n, float) or n != int(n) or not 1 <= abs(n) <= MAX_POWER:
            raise self.fail(node, f"the exponent of ** must be a whole number from 1 to {MAX_POWER} or -1 to -{MAX_POWER} (sqrt(x) for x ** 0.5)")
        out = base
        for _ in range(int(abs(n)) - 1):
            out = _fold("mul", out, base)
        return _fold("div", 1.0, out, error=self.fail(node, "not finite")) if n < 0 else out

    def call(self, node: ast.Call, fn: str, depth: int) -> Node:
        if node.keywords or len(node.args) != FUNCTIONS[fn]:
            raise self.fail(node, f"{fn} takes {FUNCTIONS[fn]} argument{'s' if FUNCTIONS[fn] > 1 else ''}")
        if fn == "col":
            arg = node.args[0]
            if not isinstance(arg, ast.Constant) or not isinstance(arg.value, str):
                raise self.fail(node, 'col takes a column name in quotes: col("my column")')
            return self.column(arg.value)
        if fn == "where":
            return ("where", self.condition(node.args[0], depth), self.number(node.args[1], depth), self.number(node.args[2], depth))
        args = [self.number(a, depth) for a in node.args]
        if fn in ("min", "max"):
            a, b = args
            if isinstance(a, float) and isinstance(b, float):
                return min(a, b) if fn == "min" else max(a, b)
            pick_b = ("lt" if fn == "min" else "gt", b, a)  # b < a: b (min); on ties and NaN in a, a
            picked: Node = ("where", pick_b, b, a)
            return picked if isinstance(b, float) else ("where", ("isnan", b), b, picked)
        return _fold(fn, args[0], error=self.fail(node, "not finite"))

    def condition(self, node: ast.AST, depth: int) -> Node:
        """A condition node (a bool array): comparisons combined with and, or, not; each reads a column."""
        if depth > MAX_DEPTH:
            raise self.fail(node, f"nested more than {MAX_DEPTH} levels")
        d = depth + 1
        if isinstance(node, ast.Compare):
            sides = [self.number(x, d) for x in [node.left, *node.comparators]]
            pairs: list[Node] = []
            for op, a, b in zip(node.ops, sides, sides[1:]):
                if type(op) not in _COMPARE:
                    raise self.fail(node, "compares with < <= > >= == != only")
                if isinstance(a, float) and isinstance(b, float):
                    raise self.fail(node, "compares two numbers (a condition reads a column)")
                pairs.append((_COMPARE[type(op)], a, b))
            return _all(pairs, "and")
        if isinstance(node, ast.BoolOp):
            return _all([self.condition(v, d) for v in node.values], "and" if isinstance(node.op, ast.And) else "or")
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return ("not", self.condition(node.operand, d))
        raise self.fail(node, "not a condition (compare numbers: I1 > 0, and combine with and, or, not)")


def _all(nodes: list[Node], op: str) -> Node:
    """``nodes`` combined by ``op`` ("and", "or"), left to right."""
    out = nodes[0]
    for n in nodes[1:]:
        out = (op, out, n)
    return out


def _fold(fn: str, *args: Node, error: ValueError | None = None) -> Node:
    """``(fn, *args)``, or its value when every argument is a number (computed as the CPU backend computes it:
    ``error`` when it is not finite)."""
    numbers = [a for a in args if isinstance(a, float)]
    if len(numbers) < len(args):
        return (fn, *args)
    return _finite(float(cpu.elementwise(fn, *(np.float64(a) for a in numbers))), error or ValueError(f"Expr: {fn}{args} is not finite"))


def _finite(x: float, error: ValueError) -> float:
    if not np.isfinite(x):
        raise error
    return x

