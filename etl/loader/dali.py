"""``DaliLoader``: the name ``Loader(..., engine="dali")`` had as a class of its own; the DALI engine itself is
``etl.loader.dali_engine``."""

from __future__ import annotations

from typing import Any

from etl.loader.api import Loader


def DaliLoader(*args: Any, **kwargs: Any) -> Loader:  # noqa: N802 - the former class's name
    """``Loader(*args, engine="dali", **kwargs)``: a loader whose engine reads the npy chunks of a processed output
    with NVIDIA DALI (``etl.loader.dali_engine``)."""
    return Loader(*args, **{**kwargs, "engine": "dali"})
