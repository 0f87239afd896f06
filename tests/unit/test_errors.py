"""etl.errors: typed errors keep their message and fields through pickling (a cluster worker raises them in the
client)."""

from __future__ import annotations

import pickle

import pytest

from etl.errors import ArtifactError, ConfigError, FitError, InputError, OutputError, RowError, SpecError


@pytest.mark.parametrize(
    "error",
    [
        RowError("raw/a.parquet", 2, 262401, "C3", "malformed value (expected 8 hex digits): 'zz123456'"),
        InputError("raw/b.parquet", "missing column", row_group=1, column="I4"),
        SpecError("p.yaml", "ops[0].columns", "unknown column"),
        FitError("Normalize", "I1", "no values"),
        ConfigError("--cluster 'x': expected local:N"),
        ArtifactError("art: no pipeline.json"),
        OutputError("out: in use"),
    ],
)
def test_errors_pickle_with_their_message_and_fields(error: Exception) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error) and back.args == error.args
    assert vars(back) == vars(error)
