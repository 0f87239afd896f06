"""etl.backends.protocol: both backend modules have every member of ``Backend`` with the same parameter names (and
the classes every method of their object protocols), and ``Backend`` lists everything ops and pipelines call."""

from __future__ import annotations

import inspect
import re
import typing
from pathlib import Path
from types import ModuleType

import pytest

from etl.backends import Backend, cpu, tensor

REPO = Path(__file__).resolve().parents[3]


def members(proto: type) -> dict[str, object]:
    """The functions and properties a Protocol class declares (``__name__`` is a property)."""
    return {n: v for n, v in vars(proto).items() if isinstance(v, property) or (inspect.isfunction(v) and not n.startswith("_"))}


def params(f: object) -> list[str]:
    """Parameter names of a function, or of a class's constructor, without ``self``."""
    return [p for p in inspect.signature(f).parameters if p != "self"]


def returned_protocol(f: object) -> type | None:
    """The Protocol class ``f`` is declared to return, if any (the objects ``KeyCounter``, ``LookupTables`` and ``ValueTable`` make)."""
    if isinstance(f, property):
        return None
    hint = typing.get_type_hints(f).get("return")
    return hint if typing.Protocol in getattr(hint, "__mro__", ()) else None


BACKEND = members(Backend)


@pytest.mark.parametrize("backend", [cpu, tensor], ids=["cpu", "tensor"])
@pytest.mark.parametrize("name", sorted(BACKEND))
def test_backend_implements_member(backend: ModuleType, name: str):
    declared = BACKEND[name]
    assert hasattr(backend, name), f"{backend.__name__} has no {name}"
    impl = getattr(backend, name)
    if isinstance(declared, property):
        assert isinstance(impl, str)
        return
    assert callable(impl)
    assert params(impl) == params(declared)
    made = returned_protocol(declared)
    if made is not None:
        assert inspect.isclass(impl)
        for method, proto_method in members(made).items():
            assert params(getattr(impl, method)) == params(proto_method), f"{backend.__name__}.{name}.{method}"


def test_classes_are_checked():
    assert {n for n in BACKEND if returned_protocol(BACKEND[n]) is not None} == {"KeyCounter", "LookupTables", "ValueTable"}


def test_backend_lists_everything_ops_and_pipelines_call():
    sources = [*sorted((REPO / "etl/ops").glob("*.py")), *sorted((REPO / "etl/pipeline").glob("*.py"))]
    called = {m for path in sources for m in re.findall(r"(?:\bxp|\(xp or self\.xp\))\.(\w+)", path.read_text())}
    assert {"fill_null", "LookupTables", "nonfinite_mask"} <= called  # the pattern finds calls in both
    assert called <= set(BACKEND), sorted(called - set(BACKEND))
