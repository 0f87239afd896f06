"""etl.resources: the default schemas and pipelines, packaged or from the source checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from etl import resources
from etl.errors import ConfigError
from etl.pipeline import Pipeline
from etl.resources import resource_path
from tests.conftest import REPO


def test_a_source_checkout_gives_its_top_level_files() -> None:
    assert resource_path("pipelines", "criteo.yaml") == REPO / "pipelines/criteo.yaml"
    assert resource_path("schemas", "movielens.yaml") == REPO / "schemas/movielens.yaml"


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "pipelines").glob("*.yaml")))
def test_every_default_pipeline_loads(name: str) -> None:
    assert Pipeline.from_file(resource_path("pipelines", name)).schema.columns


def test_the_packaged_file_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines/criteo.yaml").write_text("name: packaged\n")
    monkeypatch.setattr(resources, "_PACKAGED", tmp_path)
    assert resource_path("pipelines", "criteo.yaml") == tmp_path / "pipelines/criteo.yaml"
    assert resource_path("pipelines", "movielens.yaml") == REPO / "pipelines/movielens.yaml"


def test_an_unknown_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="pipelines/nope.yaml: no such default file"):
        resource_path("pipelines", "nope.yaml")
