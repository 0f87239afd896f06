"""Typed errors cross process boundaries (a Dask worker to the client) as the same type with the same fields."""

from __future__ import annotations

import pickle

import pytest

from etl.errors import (
    ArtifactError,
    ClusterError,
    ConfigError,
    FitError,
    InputError,
    LoaderError,
    OutputError,
    RowError,
    SpecError,
    YamlError,
    did_you_mean,
)


@pytest.mark.parametrize(
    "error",
    [
        RowError("data/part-00003.parquet", 2, 262401, "C3", "malformed value (expected 8 hex digits): 'zz123456'"),
        RowError("f.parquet", 0, 1, "C1", "x" * 500),
        InputError("f.parquet", "column missing", row_group=3, column="C7"),
        InputError("f.parquet", "no such file"),
        SpecError("pipe.yaml", "ops[2].columns", "no column named 'x'"),
        YamlError("pipe.yaml", 3, 1, "invalid YAML: did not find expected key"),
        FitError("Normalize", "I1", "no values to fit"),
        ConfigError("--partitions 0: expected an integer in [1, 2**31]"),
        ArtifactError("a: no pipeline.json"),
        LoaderError("worker failed"),
        OutputError("out: locked"),
        ClusterError("raw/part-00001.parquet: stopped: the Dask worker processes holding this task died"),
    ],
)
def test_errors_pickle_with_their_fields(error):
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert str(back) == str(error) and back.args == error.args
    assert vars(back) == vars(error)


def test_did_you_mean_names_the_closest_known_name_letter_case_aside() -> None:
    assert did_you_mean("categorify", ["Categorify", "Hash"]) == "; did you mean 'Categorify'?"
    assert did_you_mean("freq_treshold", ["freq_threshold", "max_size"]) == "; did you mean 'freq_threshold'?"
    assert did_you_mean("zzz", ["Categorify", "Hash"]) == ""
