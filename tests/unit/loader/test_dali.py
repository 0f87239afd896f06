"""etl.loader.dali on DALI's CPU backend: the same rows per epoch as the default engine, ranks disjoint and complete
with equal batch counts, exact resume, a corrupted or truncated chunk named, a chunk replaced or removed under the
loader named at its next read, DALI's own failures in one line, and the missing-DALI error. Skipped,
with the reason, where DALI is not installed (``pip install 'etl[dali]'``)."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import pytest
import torch

from etl.errors import ConfigError, InputError
from etl.io.fs import location
from etl.loader import Loader
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from etl.schema import load_schema
from etl.tools.synth import generate
from tests.conftest import REPO

HAS_DALI = importlib.util.find_spec("nvidia") is not None and importlib.util.find_spec("nvidia.dali") is not None
needs_dali = pytest.mark.skipif(not HAS_DALI, reason="NVIDIA DALI is not installed (pip install 'etl[dali]')")
ROWS = 5_003


@pytest.fixture(scope="module")
def processed(tmp_path_factory) -> Path:
    """An output with both formats, in chunks of 600 rows (shards of 1,667 and 1,668 rows: short last chunks)."""
    root = tmp_path_factory.mktemp("dali")
    shards = generate(load_schema(REPO / "schemas/criteo.yaml"), ROWS, 3, root / "raw", seed=4)
    out = root / "out"
    preprocess(Pipeline.from_file(REPO / "pipelines/criteo_hash.yaml"), [location(str(s)) for s in shards], out,
               formats=("parquet", "npy"), npy_chunk_rows=600)  # fmt: skip
    return out


def rows(batches) -> list[tuple]:
    """Every row of ``batches`` as a tuple (NaN as a sentinel, so rows compare)."""
    out = []
    for b in batches:
        m = torch.cat([b.label[:, None].double(), b.dense.double(), b.sparse.double()], 1).nan_to_num(-1e30)
        out.extend(map(tuple, m.tolist()))
    return out


@needs_dali
@pytest.mark.parametrize("shuffle", [False, True])
def test_an_epoch_holds_the_rows_of_the_default_engine(processed: Path, shuffle: bool) -> None:
    default = Loader(processed, batch_size=512, shuffle=shuffle, seed=1)
    dali = Loader(processed, batch_size=512, shuffle=shuffle, seed=1, engine="dali", shuffle_buffer=1500)
    default.set_epoch(1)
    dali.set_epoch(1)
    expected, got = rows(default), rows(dali)
    assert len(dali) == len(default) and sorted(got) == sorted(expected)
    assert (got == expected) != shuffle  # unshuffled: the same order; shuffled: another one
    again = Loader(processed, batch_size=512, shuffle=shuffle, seed=1, engine="dali", shuffle_buffer=1500)
    again.set_epoch(1)
    assert rows(again) == got  # seeded


@needs_dali
def test_dali_loader_is_the_loader_with_the_dali_engine(processed: Path) -> None:
    from etl.loader.dali import DaliLoader

    made = DaliLoader(processed, batch_size=512, shuffle=True, seed=1, shuffle_buffer=1500)
    assert type(made) is Loader and len(made.groups) == 9  # its npy chunks, 600 rows each at most
    assert rows(made) == rows(Loader(processed, batch_size=512, shuffle=True, seed=1, engine="dali", shuffle_buffer=1500))


@needs_dali
@pytest.mark.parametrize(("world_size", "drop_last"), [(2, False), (3, False), (3, True)])
def test_ranks_are_disjoint_complete_and_equal_in_batches(processed: Path, world_size: int, drop_last: bool) -> None:
    seen, counts = [], []
    for rank in range(world_size):
        loader = Loader(processed, batch_size=400, shuffle=True, seed=2, engine="dali", rank=rank, world_size=world_size, drop_last=drop_last)
        batches = list(loader)
        counts.append(len(batches))
        assert len(batches) == len(loader)
        seen.extend(rows(batches))
    assert len(set(counts)) == 1
    assert len(set(seen)) == len(seen)  # disjoint (synthetic rows are distinct)
    if not drop_last:
        assert sorted(seen) == sorted(rows(Loader(processed, batch_size=400)))


@needs_dali
def test_resume_mid_epoch_gives_the_remaining_batches(processed: Path) -> None:
    args = {"batch_size": 300, "shuffle": True, "seed": 9, "engine": "dali", "shuffle_buffer": 1000}
    full = Loader(processed, **args)
    full.set_epoch(2)
    expected = [b.sparse.clone() for b in full]
    first = Loader(processed, **args)
    first.set_epoch(2)
    head = [b.sparse.clone() for b in itertools.islice(first, 7)]
    state = first.state_dict()
    first.close()
    resumed = Loader(processed, **args)
    resumed.load_state_dict(state)
    rest = [b.sparse.clone() for b in resumed]
    assert len(head) + len(rest) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(head + rest, expected))


@needs_dali
@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_chunk_is_an_input_error_naming_it(processed: Path, tmp_path: Path, damage: str) -> None:
    import shutil

    copy = tmp_path / "out"
    shutil.copytree(processed, copy)
    chunk = copy / "npy/part-00001/dense-00001.npy"
    data = bytearray(chunk.read_bytes())
    chunk.write_bytes(bytes(data[:-8]) if damage == "truncate" else bytes(data[:-1] + bytes([data[-1] ^ 1])))
    with pytest.raises(InputError, match="dense-00001.npy"):
        Loader(copy, engine="dali")


def _rewrite(path: Path, change: bool) -> None:
    """Replace the npy file at ``path`` as a rerun of etl preprocess does (a new file renamed onto it): with other
    values when ``change``, else with its own bytes."""
    import numpy as np

    data = np.load(path)
    if change:
        data = data + 1
    tmp = path.with_name(".tmp-" + path.name)
    with open(tmp, "wb") as f:
        np.save(f, data)
    tmp.replace(path)


@needs_dali
@pytest.mark.parametrize("change", [True, False])
def test_a_chunk_replaced_between_epochs_is_noticed_at_the_next(processed: Path, tmp_path: Path, change: bool) -> None:
    """DALI reads the files itself: the engine checks them once read. A chunk replaced with other bytes after epoch 0
    is an InputError naming it in epoch 1 (the batches before it are the old rows); replaced with its own bytes, it
    is read on."""
    import shutil

    copy = tmp_path / "out"
    shutil.copytree(processed, copy)
    args = {"batch_size": 500, "engine": "dali", "shuffle_buffer": 600}
    reference = Loader(processed, **args)
    loader = Loader(copy, **args)
    assert rows(loader) == rows(reference)
    _rewrite(copy / "npy/part-00001/sparse-00001.npy", change)
    loader.set_epoch(1)
    reference.set_epoch(1)
    delivered = []
    if change:
        with pytest.raises(InputError, match=r"part-00001/sparse-00001.npy changed while this loader reads it .*sha256 \w+ differs"):
            for b in loader:
                delivered.append(b)
    else:
        delivered = list(loader)
        assert len(delivered) == len(reference)
    assert rows(delivered) == rows(itertools.islice(reference, len(delivered)))  # the old rows only, whole batches


@needs_dali
def test_a_chunk_removed_mid_pass_is_an_input_error_naming_it(processed: Path, tmp_path: Path) -> None:
    """A chunk the pass has yet to read is removed: DALI's reader fails on it, and the loader names the file in one
    line instead of DALI's error."""
    import shutil

    copy = tmp_path / "out"
    shutil.copytree(processed, copy)
    loader = Loader(copy, batch_size=500, engine="dali", shuffle_buffer=600)
    it = iter(loader)
    next(it)
    (copy / "npy/part-00002/label-00002.npy").unlink()  # the last chunk
    with pytest.raises(InputError, match=r"part-00002/label-00002.npy changed while this loader reads it .*cannot read") as e:
        list(it)
    assert "\n" not in str(e.value)


@needs_dali
def test_another_failure_of_dali_is_one_line(processed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from etl.errors import LoaderError

    loader = Loader(processed, batch_size=500, engine="dali", shuffle_buffer=600)
    it = iter(loader)
    next(it)
    message = "Critical error in pipeline:\nError in CPU operator `nvidia.dali.fn.readers.numpy`,\n\nencountered:\n\nSomething failed\nC++: [x]"

    def fail() -> None:
        raise RuntimeError(message)

    monkeypatch.setattr(it.pipe, "run", fail)
    with pytest.raises(LoaderError, match="^DALI's numpy reader failed: Something failed$"):
        list(it)


def test_without_dali_the_error_names_the_extra(processed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nvidia.dali", None)
    with pytest.raises(ConfigError, match=r"pip install 'etl\[dali\]'"):
        Loader(processed, engine="dali")


def test_an_unknown_engine_is_refused(processed: Path) -> None:
    with pytest.raises(ConfigError, match="engine"):
        Loader(processed, engine="fast")


@needs_dali
def test_an_output_without_npy_chunks_is_refused(processed: Path, tmp_path: Path) -> None:
    shards = sorted((processed.parent / "raw").glob("*.parquet"))
    out = tmp_path / "pq"
    preprocess(Pipeline.from_file(REPO / "pipelines/criteo_hash.yaml"), [location(str(s)) for s in shards], out)
    with pytest.raises(ConfigError, match="--format npy"):
        Loader(out, engine="dali")


@needs_dali
def test_a_broken_off_pass_leaves_the_loader_usable(processed: Path) -> None:
    loader = Loader(processed, batch_size=1000, engine="dali")
    first = next(iter(loader)).sparse.clone()
    loader.set_epoch(0)  # the same epoch: keeps the position
    assert loader.position == 1
    rest = list(loader)
    assert len(rest) == len(loader) - 1
    loader.close()
    again = next(iter(loader))  # the epoch ran to its end: a new iteration starts it over
    assert torch.equal(again.sparse, first)


@needs_dali
def test_object_storage_and_device_transforms_are_refused(processed: Path) -> None:
    with pytest.raises(ConfigError, match="object storage"):
        Loader("s3://bucket/processed", engine="dali")
    with pytest.raises(ConfigError, match="transform_on"):
        Loader(processed, engine="dali", transform_on="device")


def test_the_cudf_reader_and_follow_mode_are_refused(processed: Path) -> None:
    for kw in ({"reader": "cudf"}, {"follow": True}, {"arrivals": "manifest"}):
        with pytest.raises(ConfigError, match="do not apply"):
            Loader(processed, engine="dali", **kw)
