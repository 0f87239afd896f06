"""Symbolic links inside an output directory: ``etl preprocess`` and ``etl fit`` refuse a directory under the output
(the quarantine, artifacts or npy directory, an artifact table's or npy chunks' directory) that is a link, with one
line naming it, before they write or remove anything, so that nothing is written or removed outside the directory the
user named; a linked file is replaced or removed as a link, never written through; a link where the lock file goes is
one line too."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from etl.errors import OutputError
from tests.conftest import REPO, criteo_shards, run_etl, tree_bytes

CRITEO = REPO / "pipelines/criteo.yaml"
NPY = ("--format", "parquet,npy")


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    """Two raw Criteo shards of 200 rows; the second has a malformed C1 in its first row (quarantined)."""
    criteo_shards(tmp_path / "raw")
    return tmp_path / "raw"


def _preprocess(raw: Path, out: Path, *args: str, check: bool = True):
    return run_etl("preprocess", "--pipeline", CRITEO, "--input", raw, "--out", out, "--on-error", "quarantine", *args, check=check)


def _elsewhere(tmp_path: Path) -> Path:
    """A directory outside the output holding a file with a temporary's name and another file."""
    d = tmp_path / "elsewhere"
    d.mkdir()
    (d / ".part-00000.parquet.123-abcd.tmp").write_bytes(b"not a temporary of etl")
    (d / "notes.txt").write_bytes(b"precious")
    return d


def _listing(root: Path) -> list[str]:
    """Every entry under ``root`` (links not followed), hidden ones included."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


LINKED = [
    pytest.param("quarantine", (), id="quarantine"),
    pytest.param("artifacts", (), id="artifacts"),
    pytest.param("artifacts/04-Categorify", (), id="artifact-tables"),
    pytest.param("npy", NPY, id="npy"),
    pytest.param("npy/part-00000", NPY, id="npy-chunks"),
]


@pytest.mark.parametrize(("sub", "args"), LINKED)
def test_a_linked_directory_in_a_new_output_is_refused_before_anything_is_written(raw: Path, tmp_path: Path, sub: str,
                                                                                   args: tuple[str, ...]) -> None:  # fmt: skip
    out, elsewhere = tmp_path / "out", _elsewhere(tmp_path)
    (out / sub).parent.mkdir(parents=True)
    (out / sub).symlink_to(elsewhere, target_is_directory=True)
    before, listed = tree_bytes(elsewhere), _listing(out)
    proc = _preprocess(raw, out, *args, check=False)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {out / sub}: a symbolic link to the directory {elsewhere}"), line
    assert tree_bytes(elsewhere) == before and _listing(elsewhere) == sorted(before)
    assert _listing(out) == listed  # nothing written, not even the lock left behind


@pytest.mark.parametrize(("sub", "args"), LINKED)
def test_a_directory_of_an_earlier_output_replaced_by_a_link_is_refused_before_anything_is_removed(
    raw: Path, tmp_path: Path, sub: str, args: tuple[str, ...]
) -> None:
    """The earlier run's directory moved elsewhere and linked back: a rerun would remove the temporary-named file
    there, and write its files through the link."""
    out, elsewhere = tmp_path / "out", _elsewhere(tmp_path)
    _preprocess(raw, out, *args)
    for p in (out / sub).iterdir():
        shutil.move(p, elsewhere / p.name)
    (out / sub).rmdir()
    (out / sub).symlink_to(elsewhere, target_is_directory=True)
    before, kept = tree_bytes(elsewhere), tree_bytes(out)
    proc = _preprocess(raw, out, *args, check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[0].startswith(f"error: {out / sub}: a symbolic link to the directory {elsewhere}")
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert tree_bytes(elsewhere) == before and tree_bytes(out) == kept


def test_a_link_to_nothing_in_place_of_a_directory_is_refused(raw: Path, tmp_path: Path) -> None:
    """A dangling link could become a directory elsewhere at any time."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "quarantine").symlink_to(tmp_path / "not-yet")
    proc = _preprocess(raw, out, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {out / 'quarantine'}: a symbolic link to nothing ({tmp_path / 'not-yet'}) inside "
                                                f"{out}: files written or removed through it would land outside it; remove the link"]  # fmt: skip
    assert not (tmp_path / "not-yet").exists()


def test_fit_refuses_a_linked_table_directory_in_its_artifacts(raw: Path, tmp_path: Path) -> None:
    artifacts, elsewhere = tmp_path / "artifacts", _elsewhere(tmp_path)
    artifacts.mkdir()
    (artifacts / "04-Categorify").symlink_to(elsewhere, target_is_directory=True)
    before = tree_bytes(elsewhere)
    proc = run_etl("fit", "--pipeline", CRITEO, "--input", raw, "--artifacts", artifacts, "--on-error", "quarantine", check=False)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[0].startswith(f"error: {artifacts / '04-Categorify'}: a symbolic link to the directory")
    assert tree_bytes(elsewhere) == before and _listing(artifacts) == ["04-Categorify"]


def test_saving_a_pipeline_refuses_a_linked_table_directory(raw: Path, tmp_path: Path) -> None:
    from etl.pipeline import Pipeline

    p = Pipeline.from_file(CRITEO)
    p.fit([raw / "part-00000.parquet"])
    artifacts, elsewhere = tmp_path / "artifacts", _elsewhere(tmp_path)
    artifacts.mkdir()
    (artifacts / "04-Categorify").symlink_to(elsewhere, target_is_directory=True)
    before = tree_bytes(elsewhere)
    with pytest.raises(OutputError, match="04-Categorify: a symbolic link to the directory"):
        p.save(artifacts)
    assert tree_bytes(elsewhere) == before


def test_linked_files_of_an_earlier_output_are_replaced_as_links_never_written_through(raw: Path, tmp_path: Path) -> None:
    """A part file, a quarantine file, an npy chunk and the manifest that are links to files elsewhere: the rerun
    replaces or removes the links and leaves their targets as they were; its output is that of a clean run."""
    clean, out, elsewhere = tmp_path / "clean", tmp_path / "out", _elsewhere(tmp_path)
    _preprocess(raw, clean, *NPY)
    _preprocess(raw, out, *NPY)
    linked = ["part-00000.parquet", "quarantine/part-00001.parquet", "npy/part-00000/sparse-00000.npy", "manifest.json"]
    for i, name in enumerate(linked):
        target = elsewhere / f"target-{i}"
        target.write_bytes(b"precious")
        (out / name).unlink()
        (out / name).symlink_to(target)
    before = tree_bytes(elsewhere)
    _preprocess(raw, out, *NPY)
    assert tree_bytes(elsewhere) == before
    assert not [name for name in linked if (out / name).is_symlink()]
    assert tree_bytes(out) == tree_bytes(clean)


def test_a_following_run_refuses_a_linked_directory(raw: Path, tmp_path: Path) -> None:
    import threading

    from etl.pipeline import Pipeline
    from etl.preprocess.follow import preprocess_follow

    out, elsewhere = tmp_path / "out", _elsewhere(tmp_path)
    out.mkdir()
    (out / "quarantine").symlink_to(elsewhere, target_is_directory=True)
    before = tree_bytes(elsewhere)
    with pytest.raises(OutputError, match="quarantine: a symbolic link to the directory"):
        preprocess_follow(Pipeline.from_file(REPO / "pipelines/criteo_hash.yaml"), raw, out, stop=threading.Event(), stop_after_idle=0,
                          on_error="quarantine")  # fmt: skip
    assert tree_bytes(elsewhere) == before and _listing(out) == ["quarantine"]


def test_a_link_in_place_of_the_lock_file_is_refused_in_one_line(raw: Path, tmp_path: Path) -> None:
    out, elsewhere = tmp_path / "out", _elsewhere(tmp_path)
    out.mkdir()
    (out / ".etl.lock").symlink_to(elsewhere / "notes.txt")
    proc = _preprocess(raw, out, check=False)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"error: {out / '.etl.lock'}: a symbolic link where the lock file of {out} goes; remove it"]
    assert (elsewhere / "notes.txt").read_bytes() == b"precious"
