"""The default schemas and pipelines, whose one source is the repository's top-level ``schemas/*.yaml`` and
``pipelines/*.yaml``.

A regular install (``pip install .``) ships them as package data: pyproject.toml maps the packages
``etl.resources.schemas`` and ``etl.resources.pipelines`` to those two folders, so the files land beside this module
(``etl/resources/schemas/``, ``etl/resources/pipelines/``) and a pipeline's relative ``schema: ../schemas/x.yaml``
resolves inside the package. Imported from a source checkout, directly or through an editable install (whose import
machinery does not see that mapping), there are no files beside this module: ``resource_path`` then returns the
checkout's top-level file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from etl.errors import ConfigError

Kind = Literal["schemas", "pipelines"]

_PACKAGED = Path(__file__).resolve().parent  # etl/resources/, holding schemas/ and pipelines/ in a regular install
_CHECKOUT = _PACKAGED.parent.parent  # the repository root, when etl is imported from a source checkout


def resource_path(kind: Kind, name: str) -> Path:
    """The default file ``name`` of ``kind`` (e.g. ``resource_path("pipelines", "criteo.yaml")``): the packaged one
    when it exists beside this module, else the source checkout's top-level one; ConfigError when neither exists."""
    for root in (_PACKAGED, _CHECKOUT):
        path = root / kind / name
        if path.is_file():
            return path
    raise ConfigError(f"{kind}/{name}: no such default file of etl (looked in {_PACKAGED / kind} and {_CHECKOUT / kind})")
