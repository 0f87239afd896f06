#!/usr/bin/env bash
# The GPU check, for a machine with one NVIDIA GPU: scripts/gpu_check.sh OUTDIR
#
# Phase 1 (parity and the headline figures first, so that a short window still yields them):
#   1. environment: torch + CUDA, the GPU's name; the packages the repository needs (polars is optional: the
#      reader falls back to pyarrow; cudf is optional: with it, the cudf reader is measured too);
#   2. data: GPU_CHECK_ROWS (default 4,000,000) synthetic Criteo-like rows in 16 shards, and pipelines/criteo.yaml
#      fitted on them;
#   3. parity: the backend contract tests, the torch backend's unit tests and the CUDA loader/ring tests, on CUDA
#      (set ETL_SHARED_DATA to a folder holding criteo-kaggle-8k/ to include the real Criteo sample; without it
#      those tests are skipped, and pytest says so; GPU_CHECK_PARITY_TESTS replaces the list of test paths);
#   4. no host synchronisation (scripts/gpu_sync_check.py): one loader epoch with device placement under
#      torch.cuda.set_sync_debug_mode("error"); fails naming the operation and the line that synchronised
#      (skipped on CPU, which it says);
#   5. headline (scripts/gpu_placement.py --phase headline): Categorify at the first batch size, host vs device
#      placement: rows/s, CPU s per M rows, data wait at 4 M rows/s and with the DLRM;
# Phase 2:
#   6. the rest (--phase rest): the other batch sizes, the Hash pipeline, each device op's rows/s, and the cudf
#      reader when cudf is importable;
#   7. OUTDIR/gpu_report.json (everything), a short table last.
# OUTDIR receives 8 files: nvidia-smi.csv, data.log, parity.log, parity.xml, sync.log, placement.log,
# placement.json, gpu_report.json.
#
# Needs Python with torch (CUDA build), numpy, numba, pyarrow, pyyaml, typer, rich and pytest; nothing is
# installed: the repository runs from its checkout (PYTHONPATH). Timing (estimated from CPU runs, see
# BENCHMARKS.md): phase 1 within about 2 minutes on one H200, the whole script within about 5.
# GPU_CHECK_ALLOW_CPU=1 runs it without a GPU (device "cpu": a smoke test of the script itself).
set -uo pipefail

OUT=${1:?usage: scripts/gpu_check.sh OUTDIR}
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
ROWS=${GPU_CHECK_ROWS:-4000000}
WORKERS=${GPU_CHECK_WORKERS:-8}
BATCHES=${GPU_CHECK_BATCHES:-65536 262144}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$REPO" || exit 1
log() { echo "[gpu_check ${SECONDS}s] $*"; }

log "1/7 environment"
DEVICE=$("$PY" - <<'EOF'
import importlib.util, os, sys
missing = [m for m in ("numpy", "numba", "pyarrow", "yaml", "typer", "rich", "pytest", "torch") if importlib.util.find_spec(m) is None]
if missing:
    sys.exit(f"missing Python packages: {', '.join(missing)} (carry them as wheels)")
if importlib.util.find_spec("polars") is None:
    print("polars is not installed: the reader uses pyarrow", file=sys.stderr)
import torch
if torch.cuda.is_available():
    print("cuda")
elif os.environ.get("GPU_CHECK_ALLOW_CPU") == "1":
    print("cpu")
else:
    sys.exit(f"torch {torch.__version__} sees no CUDA device (GPU_CHECK_ALLOW_CPU=1 runs the script on CPU)")
EOF
) || exit 2
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv >"$OUT/nvidia-smi.csv" 2>/dev/null || true
log "device: $DEVICE"

log "2/7 data: $ROWS rows"
{ "$PY" -m etl generate --schema schemas/criteo.yaml --rows "$ROWS" --files 16 --out "$WORK/raw" &&
  "$PY" -m etl fit --pipeline pipelines/criteo.yaml --input "$WORK/raw" --artifacts "$WORK/art" --workers "$WORKERS"; } \
    >"$OUT/data.log" 2>&1 || { cat "$OUT/data.log"; exit 1; }

log "3/7 parity tests"
PARITY_TESTS=${GPU_CHECK_PARITY_TESTS:-tests/contract/test_backends.py tests/unit/backends/test_tensor.py \
tests/unit/loader/test_ring.py tests/unit/loader/test_device_stage.py tests/integration/test_loader_device.py \
tests/integration/test_loader.py::test_cuda_batches_equal_the_cpu_batches}
# shellcheck disable=SC2086 # PARITY_TESTS is a list of test paths
"$PY" -m pytest -q -p no:cacheprovider -rs --junitxml="$OUT/parity.xml" $PARITY_TESTS >"$OUT/parity.log" 2>&1
PARITY_RC=$?
tail -n 15 "$OUT/parity.log"

log "4/7 no host synchronisation on the device path"
"$PY" scripts/gpu_sync_check.py --data "$WORK/raw" --artifacts "$WORK/art" --device "$DEVICE" --workers "$WORKERS" \
    --batch-size "${BATCHES%% *}" >"$OUT/sync.log" 2>&1
SYNC_RC=$?
tail -n 5 "$OUT/sync.log"

placement() {  # $1: the phase of scripts/gpu_placement.py
    # shellcheck disable=SC2086 # BATCHES is a list of numbers
    "$PY" scripts/gpu_placement.py --data "$WORK/raw" --artifacts "$WORK/art" --device "$DEVICE" --workers "$WORKERS" \
        --batch-sizes $BATCHES --json "$OUT/placement.json" --phase "$1" >>"$OUT/placement.log" 2>&1
}
log "5/7 headline figures"
placement headline
PLACEMENT_RC=$?
if [ $PLACEMENT_RC -eq 0 ]; then tail -n 4 "$OUT/placement.log"; else tail -n 30 "$OUT/placement.log"; fi
log "phase 1 done (parity exit $PARITY_RC, sync check exit $SYNC_RC, headline exit $PLACEMENT_RC)"

log "6/7 the rest of the timings"
if [ $PLACEMENT_RC -eq 0 ]; then
    placement rest
    PLACEMENT_RC=$?
    [ $PLACEMENT_RC -eq 0 ] || tail -n 30 "$OUT/placement.log"
fi

log "7/7 report"
"$PY" - "$OUT" "$PARITY_RC" "$SYNC_RC" "$PLACEMENT_RC" "$SECONDS" "$ROWS" <<'EOF'
import json, sys, xml.etree.ElementTree as ET
from pathlib import Path
out = Path(sys.argv[1])
parity_rc, sync_rc, placement_rc, seconds, rows = map(int, sys.argv[2:])
sync_log = (out / "sync.log").read_text().strip()
report = {"rows": rows, "seconds_before_report": seconds, "parity": {"exit_code": parity_rc}, "placement": None,
          "sync_check": {"exit_code": sync_rc, "log": sync_log[-4000:]}}
xml = out / "parity.xml"
if xml.is_file():
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    report["parity"] |= {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
if (out / "nvidia-smi.csv").is_file():
    report["nvidia_smi"] = (out / "nvidia-smi.csv").read_text()
if placement_rc == 0:
    report["placement"] = json.loads((out / "placement.json").read_text())
(out / "gpu_report.json").write_text(json.dumps(report, indent=1))
p = report["parity"]
print(f"\nparity: {p.get('tests', '?')} tests, {p.get('failures', '?')} failed, {p.get('errors', '?')} errors, {p.get('skipped', '?')} skipped (exit {parity_rc})")
print(sync_log.splitlines()[-1] if sync_log else f"sync check: no output (exit {sync_rc})")
if report["placement"] is None:
    print(f"timings failed (exit {placement_rc}): see placement.log")
else:
    sys.path.insert(0, "scripts")
    from gpu_placement import print_table
    print_table(report["placement"])
sys.exit(1 if parity_rc or sync_rc or placement_rc else 0)
EOF
