"""Ops of the user's own modules (``MODULE:CLASS``): found on the Python path or beside the pipeline file, refused
with one clear error when the name, the module or the class is wrong, and fitted, saved, loaded and pickled as the
built-in ops are: in a fresh process that never imported the module too, and on Dask workers."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import etl
from etl.errors import SpecError
from etl.io.parquet import batch_from_arrow
from etl.ops import user
from etl.pipeline import Pipeline
from tests.conftest import REPO, criteo_shards
from tests.unit.pipeline.conftest import DLRM, write_pipeline

EXAMPLE = REPO / "examples" / "my_ops.py"


@pytest.fixture
def module(tmp_path: Path) -> Iterator[str]:
    """The example ops module copied beside the test's pipeline file under a name of its own (module names are
    global in a process); forgotten again at the end."""
    name = f"user_ops_{uuid.uuid4().hex[:8]}"
    shutil.copy(EXAMPLE, tmp_path / f"{name}.py")
    yield name
    sys.modules.pop(name, None)
    user._FROM_DIRECTORY.pop(name, None)


def pipeline_with(tmp_path: Path, *entries: dict, last: tuple[dict, ...] = ()) -> Path:
    """The DLRM pipeline with ``entries`` after its Clamp (ops[2]...), and ``last`` at its end."""
    return write_pipeline(tmp_path, [*DLRM[:2], *entries, *DLRM[2:], *last])


def spec_error(path: Path) -> SpecError:
    with pytest.raises(SpecError) as e:
        Pipeline.from_file(path)
    assert e.value.path == str(path)
    return e.value


def test_an_op_beside_the_pipeline_file_is_found_and_fitted(tmp_path: Path, module: str) -> None:
    p = Pipeline.from_file(pipeline_with(tmp_path, {"op": f"{module}:Winsorize", "columns": ["I1", "I2"], "upper": 0.9}))
    op = p.ops[2]
    assert isinstance(op, etl.Op) and op.name == "Winsorize" and op.upper == 0.9
    assert sys.modules[module].__file__ == str(tmp_path / f"{module}.py") and str(tmp_path) not in sys.path
    shards, table = criteo_shards(tmp_path / "raw", bad_first_c1=False)
    p.fit(shards)
    values = np.sort(np.maximum(np.nan_to_num(table["I1"].to_numpy(zero_copy_only=False).astype(float)), 0))
    assert op.bounds["I1"][1] == values[int(np.ceil(0.9 * len(values))) - 1]
    out = p.transform(batch_from_arrow(table, p.schema)).batch
    assert np.max(out["I1"].values) == np.log1p(op.bounds["I1"][1])


def test_an_op_on_the_python_path_is_found(tmp_path: Path, module: str, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "lib").mkdir()
    shutil.move(tmp_path / f"{module}.py", tmp_path / "lib" / f"{module}.py")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    p = Pipeline.from_file(pipeline_with(tmp_path, last=({"op": f"{module}:QuantileBuckets", "columns": ["I1"], "buckets": 4},)))
    assert p.ops[5].buckets == 4 and user.directory_of(type(p.ops[5])) is None


@pytest.mark.parametrize("name", ["my_ops:", ":Winsorize", "my-ops:Winsorize", "my_ops:Winsorize:x", "my_ops.:X"])
def test_a_malformed_name_is_refused(tmp_path: Path, name: str) -> None:
    e = spec_error(pipeline_with(tmp_path, {"op": name, "columns": ["I1"]}))
    assert e.field == "ops[2].op" and e.problem.startswith(f"op '{name}': expected MODULE:CLASS")


def test_a_module_found_nowhere(tmp_path: Path) -> None:
    e = spec_error(pipeline_with(tmp_path, {"op": "no_such_module_xyz:Op", "columns": ["I1"]}))
    assert e.problem == f"no module named 'no_such_module_xyz' on the Python path nor in {tmp_path} (see docs/custom-ops.md)"


def test_a_module_that_raises_is_one_error_naming_file_op_and_module(tmp_path: Path, module: str) -> None:
    (tmp_path / f"{module}.py").write_text("import etl\n\nx = 1 / 0\n")
    p = pipeline_with(tmp_path, {"op": f"{module}:Winsorize", "columns": ["I1"]})
    e = spec_error(p)
    assert str(e) == (f"{p}: field 'ops[2].op': importing module '{module}' raised ZeroDivisionError: division by zero at "
                      f"{tmp_path / module}.py:3 (see docs/custom-ops.md)")  # fmt: skip
    assert module not in sys.modules


def test_a_module_importing_a_missing_package_says_so(tmp_path: Path, module: str) -> None:
    (tmp_path / f"{module}.py").write_text("import no_such_package_xyz\n")
    e = spec_error(pipeline_with(tmp_path, {"op": f"{module}:Winsorize", "columns": ["I1"]}))
    assert e.problem.startswith(f"importing module '{module}' raised ModuleNotFoundError: No module named 'no_such_package_xyz' at ")


@pytest.mark.parametrize(
    ("cls", "problem"),
    [
        ("Winsorise", "has no class 'Winsorise'; did you mean 'Winsorize'? (its ops: QuantileBuckets, QuantileFit, Winsorize)"),
        ("np", "array_function_dispatch"),  # a module, not a class
        ("Counts", "is not a subclass of etl.Op"),
        ("QuantileFit", "QuantileFit: does not define transform"),
    ],
)
def test_a_class_that_is_no_op_is_refused(tmp_path: Path, module: str, cls: str, problem: str) -> None:
    e = spec_error(pipeline_with(tmp_path, {"op": f"{module}:{cls}", "columns": ["I1"]}))
    if cls == "np":
        assert "is not a subclass of etl.Op" in e.problem
    else:
        assert problem in e.problem, e.problem


def test_a_fittable_op_without_its_fit_is_refused(tmp_path: Path, module: str) -> None:
    (tmp_path / f"{module}.py").write_text("import etl\n\nclass Half(etl.Op):\n    fittable = True\n\n    def transform(self, batch, xp):\n"
                                           "        return {}\n\nclass Named(etl.Op):\n    name = '../x'\n")  # fmt: skip
    e = spec_error(pipeline_with(tmp_path, {"op": f"{module}:Half", "columns": ["I1"]}))
    assert "does not define new_stats, partial_fit, partials, merge, finalize_partials, state, load_state (it is fittable" in e.problem
    e = spec_error(pipeline_with(tmp_path, {"op": f"{module}:Named", "columns": ["I1"]}))
    assert "its name '../x' must be an identifier" in e.problem


def test_a_misspelt_parameter_of_a_user_op_is_named(tmp_path: Path, module: str) -> None:
    e = spec_error(pipeline_with(tmp_path, {"op": f"{module}:Winsorize", "columns": ["I1"], "uper": 0.9}))
    assert e.field == f"ops[2] ({module}:Winsorize).uper"
    assert e.problem == "unknown parameter; did you mean 'upper'? (Winsorize takes columns, lower, upper)"
    e = spec_error(pipeline_with(tmp_path, {"op": f"{module}:Winsorize", "columns": ["I1"], "upper": 2}))
    assert e.problem == "Winsorize.upper must be a number in [0, 1], got 2"


FRESH = """
import pickle, sys
from etl.pipeline import Pipeline
assert {module!r} not in sys.modules
op = pickle.loads(sys.stdin.buffer.read())
print(type(op).__name__, sorted(op.bounds), sys.modules[{module!r}].__file__)
p = Pipeline.load({artifacts!r})
print(p.ops[2].bounds == op.bounds)
"""


def test_a_fresh_process_unpickles_the_op_and_loads_the_artifacts(tmp_path: Path, module: str) -> None:
    """What a Dask worker does: the module is not on its Python path, and it never imported it."""
    p = Pipeline.from_file(pipeline_with(tmp_path, {"op": f"{module}:Winsorize", "columns": ["I1", "I2"]}))
    p.fit(criteo_shards(tmp_path / "raw", bad_first_c1=False)[0])
    p.save(tmp_path / "artifacts")
    code = FRESH.format(module=module, artifacts=str(tmp_path / "artifacts"))
    proc = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(p.ops[2]), capture_output=True, cwd="/")
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().splitlines() == [f"Winsorize ['I1', 'I2'] {tmp_path / module}.py", "True"]


def test_artifacts_whose_module_is_gone_are_an_artifact_error(tmp_path: Path, module: str) -> None:
    p = Pipeline.from_file(pipeline_with(tmp_path, {"op": f"{module}:Winsorize", "columns": ["I1"]}))
    p.fit(criteo_shards(tmp_path / "raw", bad_first_c1=False)[0])
    p.save(tmp_path / "artifacts")
    (tmp_path / f"{module}.py").unlink()
    code = f"from etl.pipeline import Pipeline\nPipeline.load({str(tmp_path / 'artifacts')!r})"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert f"ArtifactError: {tmp_path / 'artifacts' / 'pipeline.json'}: field 'ops[2].op': no module named '{module}' on the Python path " \
           f"nor in {tmp_path}" in proc.stderr  # fmt: skip


def test_a_dask_fit_imports_the_module_on_the_workers(tmp_path: Path, module: str, local_cluster) -> None:
    """The workers of the session's cluster never had the module's directory on their path."""
    winsorize, buckets = {"op": f"{module}:Winsorize", "columns": ["I1", "I2"]}, {"op": f"{module}:QuantileBuckets", "columns": ["I3"], "buckets": 5}
    shards = criteo_shards(tmp_path / "raw", bad_first_c1=False)[0]
    threads, cluster = (Pipeline.from_file(pipeline_with(tmp_path, winsorize, last=(buckets,))) for _ in range(2))
    threads.fit(shards, workers=2)
    cluster.fit(shards, client=local_cluster, workdir=tmp_path)
    threads.save(tmp_path / "a")
    cluster.save(tmp_path / "b")
    assert (tmp_path / "a/pipeline.json").read_bytes() == (tmp_path / "b/pipeline.json").read_bytes()
    assert (tmp_path / "a/06-QuantileBuckets/I3.parquet").read_bytes() == (tmp_path / "b/06-QuantileBuckets/I3.parquet").read_bytes()
