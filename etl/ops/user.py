"""Ops of the user's own modules: a pipeline entry names one as ``MODULE:CLASS`` (``{op: "my_ops:Winsorize", ...}``).

The class must subclass ``etl.Op`` (``etl.ops.base``, whose docstring is the contract) and lives in a module that
is found

1. on the Python path (``sys.path``: ``PYTHONPATH``, installed packages, the current directory under ``python -m``);
2. else, for a pipeline read from a file, in the directory of that file: ``my_ops.py`` (or a package ``my_ops/``)
   beside ``pipeline.yaml`` works however ``etl`` is started. Such a module is imported under its own name
   (``sys.modules``) without adding the directory to ``sys.path``.

Module names are global in a process: a module already imported under a name is the one every pipeline naming it
gets. An op whose module came from a pipeline's directory keeps that directory: pickled (the pipeline a Dask fit
sends its workers), it is rebuilt by importing the module from there, and the artifacts of its pipeline record it
(``etl.pipeline.artifacts``), so that ``Pipeline.load`` (``etl preprocess``, the Loader, Dask workers) finds the
module again. The directory must then be one the loading process sees at the same path.

Importing a module runs its code: a pipeline naming a module is code, as a Python script is.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import inspect
import re
import sys
import traceback
from pathlib import Path
from typing import Any

from etl.errors import did_you_mean
from etl.ops.base import Op

#: ``MODULE:CLASS``: a dotted module name, a colon, a class name
OP_NAME = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*):([A-Za-z_]\w*)")
#: an op's ``name`` (table directories of its artifacts are named after it)
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")

#: top-level module name -> the directory it was imported from (modules found in a pipeline's directory only)
_FROM_DIRECTORY: dict[str, Path] = {}

#: what a fittable op must define, beyond ``transform``
FIT_METHODS = ("new_stats", "partial_fit", "partials", "merge", "finalize_partials", "state", "load_state")


def is_user_op(name: str) -> bool:
    """Whether the op name of a pipeline entry names a class of a module (``MODULE:CLASS``) rather than a built-in op."""
    return ":" in name


def find_op(name: str, directory: Path | None) -> type[Op]:
    """The op class ``name`` (``MODULE:CLASS``) names, its module imported from the Python path or else from
    ``directory`` (None: the Python path only). ``ValueError`` saying what is wrong: a malformed name, a module
    found nowhere, a module whose import raises (the exception, and the line of the module it came from), no such
    class, a class that is no ``etl.Op``, lacks ``transform`` or, fittable, a method of the fit."""
    m = OP_NAME.fullmatch(name)
    if m is None:
        raise ValueError(f"op {name!r}: expected MODULE:CLASS, a module name on the Python path and a class in it (my_ops:Winsorize)")
    module_name, class_name = m.groups()
    module = _import(module_name, directory)
    cls = getattr(module, class_name, None)
    where = f"module '{module_name}' ({getattr(module, '__file__', None) or 'built in'})"
    if cls is None:
        ops = sorted(k for k, v in vars(module).items() if inspect.isclass(v) and issubclass(v, Op) and v.__module__ == module.__name__)
        raise ValueError(f"{where} has no class '{class_name}'{did_you_mean(class_name, ops)} (its ops: {', '.join(ops) or 'none'})")
    if not inspect.isclass(cls) or not issubclass(cls, Op) or cls is Op:
        raise ValueError(f"{name}: {cls!r} of {where} is not a subclass of etl.Op")
    _check_class(cls, name)
    return cls


def _check_class(cls: type[Op], name: str) -> None:
    """``ValueError`` unless ``cls`` has an identifier as its ``name``, defines ``transform`` and, when fittable,
    every method of the fit and of its saved state."""
    if not isinstance(cls.name, str) or not _IDENTIFIER.fullmatch(cls.name):
        raise ValueError(f"{name}: its name {cls.name!r} must be an identifier (letters, digits, _): it names the op in errors and artifacts")
    missing = [m for m in ("transform", *(FIT_METHODS if cls.fittable else ())) if getattr(cls, m) is getattr(Op, m)]
    if missing:
        fit = " (it is fittable: fittable = True)" if set(missing) - {"transform"} else ""
        raise ValueError(f"{name}: does not define {', '.join(missing)}{fit}")


def _import(module_name: str, directory: Path | None) -> Any:
    """The module ``module_name``, imported (see the module docstring for where it is looked for)."""
    top = module_name.split(".")[0]
    try:
        if top not in sys.modules and importlib.util.find_spec(top) is None and directory is not None:
            _import_from(top, directory)
        return importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name == e.name or module_name.startswith(f"{e.name}.")):
            beside = f" nor in {directory}" if directory is not None else ""
            raise ValueError(f"no module named '{e.name}' on the Python path{beside}") from None
        raise ValueError(_raised(module_name, e)) from None
    except Exception as e:  # noqa: BLE001 - any error the module's code raises as it is imported
        raise ValueError(_raised(module_name, e)) from None


def _import_from(top: str, directory: Path) -> None:
    """Import the top-level module or package ``top`` from ``directory`` under its own name, if it is there."""
    spec = importlib.machinery.PathFinder.find_spec(top, [str(directory)])
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[top] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[top]
        raise
    _FROM_DIRECTORY[top] = directory


def _raised(module_name: str, e: BaseException) -> str:
    """What importing ``module_name`` raised, with the place in the user's code it came from."""
    frames = traceback.extract_tb(e.__traceback__)
    user = [f for f in frames if "importlib" not in f.filename]
    at = f" at {user[-1].filename}:{user[-1].lineno}" if user else ""
    return f"importing module '{module_name}' raised {type(e).__name__}: {e}{at}"


def directory_of(cls: type) -> Path | None:
    """The directory the module of ``cls`` was imported from by ``find_op`` (None: the Python path, or not a user op)."""
    return _FROM_DIRECTORY.get(cls.__module__.split(".")[0])


def rebuild(directory: str, module_name: str, qualname: str) -> Op:
    """An empty instance of the op class ``module_name:qualname``, its module imported from the Python path or
    ``directory``: what an op pickled by ``Op.__reduce_ex__`` is rebuilt from (its state is set after)."""
    cls = find_op(f"{module_name}:{qualname}", Path(directory))
    return cls.__new__(cls)
