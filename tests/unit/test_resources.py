"""etl.resources: the default schemas and pipelines, packaged or from the source checkout."""

from __future__ import annotations

from pathlib import Path

import pytest

from etl import resources
from etl.errors import ConfigError, SpecError
from etl.pipeline import Pipeline
from etl.resources import resource_path
from etl.schema import load_schema
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


def test_names_are_the_shipped_files_without_yaml() -> None:
    assert resources.names("schemas") == sorted(p.stem for p in (REPO / "schemas").glob("*.yaml"))
    assert {"criteo", "criteo_hash", "movielens"} <= set(resources.names("pipelines"))


@pytest.mark.parametrize(
    "value, name",
    [("criteo", True), ("my-data_2", True), ("criteo.yaml", False), ("x.yml", False), ("./criteo", False), ("a/b", False), ("", False),
     ("..", False)],  # fmt: skip
)
def test_is_name(value: str, name: bool) -> None:
    assert resources.is_name(value) is name


def test_a_name_resolves_to_the_shipped_file_from_anywhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert resources.resolve("schemas", "criteo") == REPO / "schemas/criteo.yaml"
    assert resources.resolve("pipelines", Path("criteo_hash")) == REPO / "pipelines/criteo_hash.yaml"
    assert load_schema("criteo").names[:2] == ["label", "I1"]
    assert Pipeline.from_file("criteo_hash").name == "criteo_hash"


def test_an_existing_path_wins_over_a_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "criteo").write_text("a file of the user's")
    assert resources.resolve("schemas", "criteo") == Path("criteo")
    assert resources.resolve("schemas", "missing.yaml") == Path("missing.yaml")  # a path: its reader says it is missing
    with pytest.raises(SpecError, match="missing.yaml: field '<file>': no such file"):
        load_schema("missing.yaml")


def test_an_unknown_name_lists_the_shipped_ones_and_the_closest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as e:
        Pipeline.from_file("critoe_hash")
    assert "critoe_hash: no such file, nor a pipeline that ships with etl" in str(e.value)
    assert "criteo, criteo_hash, criteo_sample" in str(e.value) and str(e.value).endswith("did you mean 'criteo_hash'?")
    with pytest.raises(ConfigError, match=r"shipped: avazu, .*; see etl list\)$"):
        load_schema("zzzzzz")  # nothing close: no guess


def _pipeline(directory: Path, schema: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    text = (REPO / "pipelines/criteo_hash.yaml").read_text().replace("schema: ../schemas/criteo.yaml", f"schema: {schema}")
    (directory / "p.yaml").write_text(text)
    return directory / "p.yaml"


def test_a_pipelines_schema_is_relative_to_it_first(tmp_path: Path) -> None:
    own = tmp_path / "schemas/criteo.yaml"
    own.parent.mkdir()
    own.write_text((REPO / "schemas/criteo.yaml").read_text().replace("name: criteo", "name: mine"))
    assert Pipeline.from_file(_pipeline(tmp_path / "pipelines", "../schemas/criteo.yaml")).schema.name == "mine"


@pytest.mark.parametrize("schema", ["criteo", "../schemas/criteo.yaml", "elsewhere/criteo.yml"])
def test_a_copied_pipeline_falls_back_to_the_shipped_schema(tmp_path: Path, schema: str) -> None:
    p = Pipeline.from_file(_pipeline(tmp_path, schema))
    assert p.schema.name == "criteo" and p.schema.path == str(REPO / "schemas/criteo.yaml")


def test_a_pipelines_unknown_schema_names_the_pipeline_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"p.yaml: field 'schema': critoe: no such file, .*did you mean 'criteo'\?"):
        Pipeline.from_file(_pipeline(tmp_path, "critoe"))
    with pytest.raises(SpecError, match=r"nowhere/mine.yaml: field '<file>': no such file"):
        Pipeline.from_file(_pipeline(tmp_path, "nowhere/mine.yaml"))


@pytest.mark.parametrize("kind", ["schemas", "pipelines"])
def test_every_shipped_file_has_a_one_line_summary(kind: resources.Kind) -> None:
    for name in resources.names(kind):
        line = resources.summary(kind, name)
        assert line and "\n" not in line and (len(line) <= resources.SUMMARY_CHARS or ":" not in line), (name, line)
    assert resources.summary("pipelines", "criteo_hash") == "MLPerf-style Criteo preprocessing"  # the title of a long sentence
    assert resources.summary("pipelines", "avazu") == "Avazu: every feature categorical."


def test_summary_takes_the_first_sentence_outside_parentheses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines/mine.yaml").write_text("# Mine (a. b. c.) does it. More text.\n# And more.\nname: mine\n")
    monkeypatch.setattr(resources, "_PACKAGED", tmp_path)
    assert resources.summary("pipelines", "mine") == "Mine (a. b. c.) does it."
