"""etl.io.fs: locations from what users type, and object-storage files against a real S3 API (the ``s3``
fixture: moto in server mode)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

from etl.errors import ConfigError, InputError, OutputError
from etl.io.files import atomic_write_bytes, atomic_write_parquet, remove_temporaries, sha256_file, temporary_path
from etl.io.fs import Url, accessing, fingerprint, identity, is_within, location, remove_tree, replace
from etl.io.parquet import footer_sha256, list_shards, open_shard, read_footer
from etl.io.paths import expand_globs
from etl.io.text import ShardSetWriter, raw_arrow_schema
from etl.schema import ColumnSpec, Schema, load_schema
from etl.tools.synth import generate
from tests.conftest import REPO


def test_location_keeps_urls_whole_and_makes_file_urls_local(tmp_path: Path) -> None:
    u = location("s3://bucket/raw/", {"anon": True})
    assert isinstance(u, Url)
    assert str(u) == "s3://bucket/raw" and u.key == "bucket/raw" and u.protocol == "s3"
    assert u.storage_options == {"anon": True}
    assert str(u / "part-00000.parquet") == "s3://bucket/raw/part-00000.parquet"
    assert (u / "a.parquet").name == "a.parquet" and (u / "a.parquet").parent == u
    assert str((u / "a").with_name("b")) == "s3://bucket/raw/b"
    assert location(f"file://{tmp_path}/x") == tmp_path / "x"
    assert location("relative/dir") == Path("relative/dir")
    assert location("gs://b/k") == Url("gs://b/k") and location("abfs://c/k") == Url("abfs://c/k")


def test_gcs_urls_are_parsed_and_get_their_filesystem_without_network() -> None:
    gcsfs = pytest.importorskip("gcsfs")
    for scheme in ("gs", "gcs"):
        u = location(f"{scheme}://bucket/raw/", {"token": "anon"})
        assert isinstance(u, Url) and str(u) == f"{scheme}://bucket/raw" and u.key == "bucket/raw" and u.protocol == scheme
        assert u.storage_options == {"token": "anon"} and str(u / "a.parquet") == f"{scheme}://bucket/raw/a.parquet"
        assert isinstance(u.fs, gcsfs.GCSFileSystem) and u.fs._strip_protocol(str(u / "a")) == "bucket/raw/a"


def test_azure_urls_are_parsed_and_get_their_filesystem_without_network() -> None:
    adlfs = pytest.importorskip("adlfs")
    u = location("abfs://container@acct.dfs.core.windows.net/raw/", {"anon": True})
    assert isinstance(u, Url) and str(u) == "abfs://container/raw" and u.key == "container/raw"
    assert u.storage_options == {"account_name": "acct", "anon": True}  # the account named in the URL
    assert (u / "part-00000.parquet").storage_options == u.storage_options
    assert isinstance(u.fs, adlfs.AzureBlobFileSystem) and u.fs.account_name == "acct"
    assert location("abfs://container@acct.dfs.core.windows.net/raw", {"account_name": "other"}).storage_options["account_name"] == "other"
    v = location("az://container/raw", {"account_name": "acct", "anon": True})
    assert isinstance(v, Url) and str(v) == "az://container/raw" and v.key == "container/raw" and v.fs.account_name == "acct"


def test_identity_sees_a_same_size_rewrite_in_place_whose_modification_time_is_set_back(tmp_path: Path) -> None:
    f = tmp_path / "part-00000.parquet"
    f.write_bytes(b"a" * 100)
    st = f.stat()
    before = identity(f)
    time.sleep(0.01)  # a later status change time, also on file systems with coarse clocks
    with open(f, "r+b") as h:
        h.write(b"b")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert fingerprint(f) == (st.st_size, st.st_mtime_ns)  # what a size + mtime check would take as unchanged
    assert identity(f) != before


def test_within_compares_prefixes_and_never_mixes_kinds(tmp_path: Path) -> None:
    root = Url("s3://b/out")
    assert is_within(root / "x", root) and is_within(root, root)
    assert not is_within(Url("s3://b/outside"), root)  # a prefix of the name is not a parent
    assert not is_within(tmp_path, root) and not is_within(root, tmp_path)
    assert is_within(tmp_path / "x", tmp_path)


def test_writes_reads_and_moves_objects(s3: str) -> None:
    d = location(f"{s3}/dir")
    assert isinstance(d, Url)
    atomic_write_bytes(d / "a.bin", b"hello")
    assert (d / "a.bin").read_bytes() == b"hello" and (d / "a.bin").is_file() and d.is_dir()
    size, mtime_ns = fingerprint(d / "a.bin")
    assert size == 5 and mtime_ns > 0
    assert sha256_file(d / "a.bin") == "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
    replace(d / "a.bin", d / "b.bin")
    assert [p.name for p in d.iterdir()] == ["b.bin"]
    tmp = temporary_path(d / "c.bin")
    atomic_write_bytes(tmp, b"partial")
    work = temporary_path(d / "fit")  # the work directory of an interrupted fit: a prefix of objects
    atomic_write_bytes(work / "counts" / "00-0" / "000000.parquet", b"spilled")
    remove_temporaries(d)
    assert [p.name for p in d.iterdir()] == ["b.bin"]
    remove_tree(d)
    assert not d.exists()
    remove_tree(d)  # nothing there: nothing to do


def test_a_failed_upload_leaves_no_object(s3: str) -> None:
    target = Url(f"{s3}/never")
    with pytest.raises(RuntimeError), target.open("wb") as f:
        f.write(b"x" * 100)
        raise RuntimeError("the writer failed")
    assert not target.exists()


def test_a_missing_bucket_is_an_error_naming_the_url(s3: str) -> None:
    missing = Url("s3://etl-no-such-bucket/x")
    with pytest.raises(OutputError, match="s3://etl-no-such-bucket/x: cannot write"):
        atomic_write_bytes(missing, b"1")
    with pytest.raises(InputError, match="s3://etl-no-such-bucket/x"):
        list_shards("s3://etl-no-such-bucket/x")


def test_shards_in_object_storage_are_listed_globbed_and_read(s3: str) -> None:
    d = location(f"{s3}/raw")
    assert isinstance(d, Url)
    table = pa.table({"label": pa.array([1, 0, 1], pa.int64()), "c": pa.array(["a", None, "b"])})
    for name in ("part-00001.parquet", "part-00000.parquet", "notes.txt"):
        atomic_write_parquet(table, d / name, row_group_size=2)
    names = ["part-00000.parquet", "part-00001.parquet"]
    assert [p.name for p in list_shards(d)] == names
    assert [p.name for p in list_shards(f"{s3}/raw/part-*.parquet")] == names
    assert [str(p) for p in expand_globs([f"{s3}/r*/part-0000[1].parquet"])] == [f"{s3}/raw/part-00001.parquet"]
    with pytest.raises(InputError, match="no file or directory matches"):
        expand_globs([f"{s3}/raw/*.csv"])
    schema = Schema("t", (ColumnSpec("label", "label", "int64"), ColumnSpec("c", "categorical", "string")))
    shard = open_shard(d / names[0], schema)
    assert shard.num_row_groups == 2 and shard.row_group_starts == [0, 2]
    assert shard.read_table(1).column("label").to_pylist() == [1]
    assert shard.read(0).num_rows == 2
    assert len(footer_sha256(d / names[0])) == 64


def test_shard_sets_replace_objects_all_at_once(s3: str) -> None:
    schema = load_schema(REPO / "schemas/criteo.yaml")
    out = location(f"{s3}/synth")
    assert isinstance(out, Url)
    first = generate(schema, 300, 3, out, seed=1)
    assert [p.name for p in first] == [f"part-0000{i}.parquet" for i in range(3)]
    second = generate(schema, 200, 2, out, seed=2)
    assert [p.name for p in out.iterdir()] == [p.name for p in second]  # the stale third shard is gone, no temporary left
    with pytest.raises(RuntimeError), ShardSetWriter(out, raw_arrow_schema(schema)) as shards:
        shards.open(0).close()
        raise RuntimeError("the writer failed")
    assert [p.name for p in out.iterdir()] == [p.name for p in second]  # an aborted set changes nothing


def test_storage_options_reach_the_filesystem(s3: str, s3_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    atomic_write_parquet(pa.table({"label": [1, 0]}), Url(f"{s3}/opts/part-00000.parquet"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens there: only the options can reach the server
    Url(s3).fs.clear_instance_cache()  # filesystems made from now on read the environment afresh
    options = {"endpoint_url": s3_server, "key": "testing", "secret": "testing", "config_kwargs": {"retries": {"max_attempts": 1}}}
    shards = list_shards(f"{s3}/opts", storage_options=options)
    assert [str(p) for p in shards] == [f"{s3}/opts/part-00000.parquet"]
    assert isinstance(shards[0], Url) and shards[0].storage_options == options
    assert read_footer(shards[0]).num_rows == 2


def test_storage_refusing_or_unreachable_is_a_config_error_naming_the_url() -> None:
    botocore = pytest.importorskip("botocore.exceptions")
    url = Url("s3://bucket/raw")
    for error, shown in [
        (PermissionError("The AWS Access Key Id you provided does not exist in our records."), "access denied: The AWS Access Key Id"),
        (botocore.NoCredentialsError(), "cannot access object storage: Unable to locate credentials"),
        (botocore.EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), "cannot access object storage: Could not connect"),
    ]:
        with pytest.raises(ConfigError) as info, accessing(url):
            raise error
        assert str(info.value).startswith(f"s3://bucket/raw: {shown}") and "AWS_ENDPOINT_URL" in str(info.value)
    with pytest.raises(FileNotFoundError), accessing(url):  # a missing object is the caller's to report
        raise FileNotFoundError("s3://bucket/raw")
