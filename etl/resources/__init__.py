"""The default schemas and pipelines, whose one source is the repository's top-level ``schemas/*.yaml`` and
``pipelines/*.yaml``.

A regular install (``pip install .``) ships them as package data: pyproject.toml maps the packages
``etl.resources.schemas`` and ``etl.resources.pipelines`` to those two folders, so the files land beside this module
(``etl/resources/schemas/``, ``etl/resources/pipelines/``) and a pipeline's relative ``schema: ../schemas/x.yaml``
resolves inside the package. Imported from a source checkout, directly or through an editable install (whose import
machinery does not see that mapping), there are no files beside this module: ``resource_path`` then returns the
checkout's top-level file.

Wherever a schema or a pipeline file is named (``--schema``, ``--pipeline``, ``load_schema``, ``Pipeline.from_file``,
``etl.Loader(pipeline=...)``, a pipeline's ``schema:``), a shipped one may be named by its *name*, the file name
without ``.yaml``: ``criteo``, ``criteo_hash``. ``resolve`` says which is meant: a value naming an existing path is
that path; a bare name (no ``/``, no ``.yaml``/``.yml`` ending) is a shipped file's name; ``etl list`` shows them
(``names``, ``summary``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from etl.errors import ConfigError, did_you_mean

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


_YAML_SUFFIXES = (".yaml", ".yml")


def names(kind: Kind) -> list[str]:
    """The names of the shipped files of ``kind`` (file names without ``.yaml``), sorted."""
    return sorted({p.stem for root in (_PACKAGED, _CHECKOUT) for p in (root / kind).glob("*.yaml") if p.is_file()})


def is_name(value: str | Path) -> bool:
    """Whether ``value`` reads as a shipped file's name rather than a path: no directory part, no YAML suffix."""
    text = str(value)
    return bool(text) and "/" not in text and "\\" not in text and not text.endswith(_YAML_SUFFIXES) and text not in (".", "..")


def shipped(kind: Kind, name: str) -> Path:
    """The shipped file of ``kind`` called ``name``; ConfigError listing the shipped names (the closest first, as
    "did you mean") when there is none."""
    if name in names(kind):
        return resource_path(kind, name + ".yaml")
    raise ConfigError(f"{name}: no such file, nor a {kind[:-1]} that ships with etl (shipped: {', '.join(names(kind))}; see etl list)"
                      + did_you_mean(name, names(kind)))


def shipped_name(kind: Kind, path: str | Path) -> str | None:
    """The name of the shipped file of ``kind`` that ``path`` is, or None when it is none of them."""
    where = Path(path).resolve()
    return next((name for name in names(kind) if resource_path(kind, name + ".yaml").resolve() == where), None)


def resolve(kind: Kind, value: str | Path) -> Path:
    """The file ``value`` names: the path itself when it exists or does not read as a name (``is_name``; a missing
    path is then reported by whoever reads it), else the shipped file of that name (ConfigError when none ships)."""
    path = Path(value)
    if path.exists() or not is_name(value):
        return path
    return shipped(kind, str(value))


def resolve_schema_of(pipeline: Path, value: str) -> Path:
    """The schema file a pipeline file names with ``schema: value``: ``value`` relative to the pipeline's directory
    when that exists; else the shipped schema named ``value`` (a bare name, ``schema: criteo``), or, for a path, the
    shipped schema of its file name (a pipeline copied away from ``../schemas/criteo.yaml`` still finds criteo);
    else the relative path, for the reader to report missing."""
    near = pipeline.parent / value
    if near.exists():
        return near
    if is_name(value):
        return shipped("schemas", value)
    own = Path(value)
    if own.suffix in _YAML_SUFFIXES and own.stem in names("schemas"):
        return resource_path("schemas", own.stem + ".yaml")
    return near


def summary(kind: Kind, name: str) -> str:
    """One line on the shipped file ``name`` of ``kind``, from a schema's ``description:`` or the comment block a
    pipeline file opens with: its first sentence, or, when that is longer than ``SUMMARY_CHARS``, the sentence's
    title (what comes before its first colon). Empty when the file has neither."""
    text = resource_path(kind, name + ".yaml").read_text()
    if kind == "schemas":
        import yaml

        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError:
            return ""
        described = doc.get("description") if isinstance(doc, dict) else None
        words = described if isinstance(described, str) else ""
    else:
        comments = []
        for line in text.splitlines():
            if not line.startswith("#"):
                break
            comments.append(line.lstrip("#").strip())
        words = " ".join(comments)
    sentence = _up_to(" ".join(words.split()), ". ")
    return sentence if len(sentence) <= SUMMARY_CHARS else _up_to(sentence, ": ").rstrip(":")


#: the longest first sentence ``summary`` gives whole
SUMMARY_CHARS = 100


def _up_to(text: str, stop: str) -> str:
    """``text`` up to the first ``stop`` outside parentheses (its first character kept), or the whole of it."""
    depth = 0
    for i, c in enumerate(text):
        depth += (c == "(") - (c == ")")
        if depth == 0 and text.startswith(stop, i):
            return text[: i + 1]
    return text
