"""The entries of a pipeline's ``ops`` list: the class an entry names, and whether its parameters are the class's.

An entry's ``op`` is a built-in op (``etl.ops.REGISTRY``: ``Categorify``...) or ``MODULE:CLASS``, an op of the
user's own module (``etl.ops.user``). What is wrong is said in the words of the pipeline file, with the nearest
names (``difflib``): an unknown op suggests the built-in op it resembles; a parameter the op does not take, the one
it resembles and every parameter the op takes, read from the signature of its ``__init__`` (user ops alike).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from etl.errors import did_you_mean
from etl.ops import REGISTRY, Op
from etl.ops.user import find_op, is_user_op

#: Where ops and their parameters are documented (named in errors about unknown ops and parameters).
PIPELINE_DOCS = "pipelines/README.md"
#: Where writing an op of one's own is documented.
CUSTOM_OPS_DOCS = "docs/custom-ops.md"


def op_class(name: Any, others: list[str], directory: Path | None) -> type[Op]:
    """The op class the entry's ``op`` value ``name`` names; ``others``: the names of what an entry may name beside
    ops (Groupby), for the list of known names. ``directory``: where a user op's module is looked for after the
    Python path (``etl.ops.user.find_op``). ``ValueError`` saying what is wrong."""
    if not isinstance(name, str):
        raise ValueError(f"expected the name of an op, got {name!r}")
    if is_user_op(name):
        try:
            return find_op(name, directory)
        except ValueError as e:
            raise ValueError(f"{e} (see {CUSTOM_OPS_DOCS})") from None
    cls = REGISTRY.get(name)
    if cls is None:
        known = sorted([*REGISTRY, *others])
        raise ValueError(f"unknown op {name!r}{did_you_mean(name, known)} (known: {', '.join(known)}, see {PIPELINE_DOCS}; "
                         f"an op of your own: MODULE:CLASS, see {CUSTOM_OPS_DOCS})")  # fmt: skip
    return cls


def parameters(cls: type[Op]) -> tuple[list[str], list[str], bool]:
    """The parameters ``cls.__init__`` takes besides ``columns``: (all of them, the required ones, whether it takes
    any keyword: ``**params``). ``Op.__init__``'s own ``**params`` is no parameter: an op that keeps it takes none."""
    if cls.__init__ is Op.__init__:
        return [], [], False
    names, required, any_keyword = [], [], False
    for p in list(inspect.signature(cls.__init__).parameters.values())[2:]:  # self, columns
        if p.kind is p.VAR_KEYWORD:
            any_keyword = True
        elif p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            names.append(p.name)
            if p.default is p.empty:
                required.append(p.name)
    return names, required, any_keyword


def check_parameters(cls: type[Op], params: dict[str, Any]) -> tuple[str, str] | None:
    """(the parameter at fault, the problem) for the first parameter of ``params`` that ``cls`` does not take or
    the first one it requires that ``params`` lacks; None when they fit."""
    names, required, any_keyword = parameters(cls)
    takes = f"{cls.name} takes {', '.join(['columns', *names])}" if names else f"{cls.name} takes columns only"
    if REGISTRY.get(cls.name) is cls:
        takes += f"; see {PIPELINE_DOCS}"
    if not any_keyword:
        for p in params:
            if p not in names:
                return p, f"unknown parameter{did_you_mean(p, names)} ({takes})"
    for p in required:
        if p not in params:
            return p, f"missing ({takes})"
    return None
