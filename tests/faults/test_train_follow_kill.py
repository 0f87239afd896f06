"""Continuous training survives kill -9: ``scripts/produce_shards.py --manifest`` fills a directory with traced
shards, listing each in its producer manifest, while ``scripts/train_dlrm.py --follow --arrivals manifest --resume``
trains on it, checkpointing model, optimizer and loader together, and is SIGKILLed and restarted several times. The
rows the last checkpoint counts as trained (its committed trace) are, as a multiset, exactly the rows the producer
wrote: none lost, none trained twice. (A consumer in name order is killed the same way in
test_follow_exactly_once.py.)"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import torch

from etl.io.arrivals_manifest import read_arrivals
from etl.pipeline import Pipeline
from tests.conftest import REPO

SHARDS, SHARD_ROWS = 6, 250
KILLS = 2
TRAIN = [sys.executable, str(REPO / "scripts/train_dlrm.py"), "--pipeline", str(REPO / "pipelines/criteo_hash.yaml"), "--follow",
         "--arrivals", "manifest", "--poll-interval", "0.05", "--steps", "0", "--batch-size", "64", "--checkpoint-every", "3", "--resume",
         "--trace-column", "I1", "--device", "cpu", "--workers", "1", "--max-emb-rows", "100", "--emb-dim", "4", "--log-every", "1000"]  # fmt: skip


def committed(ckpt: Path) -> list[float]:
    """The traced values of the rows the checkpoint at ``ckpt`` has trained on."""
    if not ckpt.exists():
        return []
    length = torch.load(ckpt, weights_only=True)["trace_bytes"]
    trace = ckpt.with_name(ckpt.name + ".trace").read_bytes()[:length]
    return [float(line) for line in trace.decode().split()]


def test_training_killed_and_restarted_trains_every_row_once(tmp_path: Path) -> None:
    rng = random.Random(0)
    raw, ckpt = tmp_path / "raw", tmp_path / "ckpt" / "train.pt"
    ckpt.parent.mkdir()
    raw.mkdir()  # the trainer starts while the producer does: it follows an empty directory at first
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    producer = subprocess.Popen([sys.executable, str(REPO / "scripts/produce_shards.py"), "--out", str(raw), "--shards", str(SHARDS),
                                 "--shard-rows", str(SHARD_ROWS), "--rate", "4", "--manifest"], env=env, stdout=subprocess.DEVNULL)  # fmt: skip
    argv = TRAIN + ["--data", str(raw), "--checkpoint", str(ckpt)]
    total, kills = SHARDS * SHARD_ROWS, 0
    try:
        while True:
            trainer = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            try:
                deadline = time.monotonic() + 60
                if kills < KILLS:  # kill it once it has committed a few more rows
                    target = len(committed(ckpt)) + rng.randint(1, 400)
                    while len(committed(ckpt)) < min(target, total) and trainer.poll() is None and time.monotonic() < deadline:
                        time.sleep(rng.uniform(0.02, 0.1))
                    assert trainer.poll() is None, trainer.stderr.read().decode() if trainer.stderr else ""
                    trainer.send_signal(signal.SIGKILL)
                    trainer.wait()
                    kills += 1
                    continue
                while len(committed(ckpt)) < total and time.monotonic() < deadline:
                    assert trainer.poll() is None, trainer.stderr.read().decode() if trainer.stderr else ""
                    time.sleep(0.1)
                time.sleep(0.3)  # a row trained twice would be committed by now
                break
            finally:
                if trainer.poll() is None:
                    trainer.kill()
                trainer.wait()
                if trainer.stderr:
                    trainer.stderr.close()
    finally:
        producer.kill()
        producer.wait()
    pipeline = Pipeline.from_file(REPO / "pipelines/criteo_hash.yaml")
    assert read_arrivals(raw) == sorted(p.name for p in raw.glob("*.parquet"))
    written = [v for p in sorted(raw.glob("*.parquet")) for v in pipeline.transform_table(pq.read_table(p)).column("I1").to_pylist()]
    assert kills == KILLS and len(written) == total and len(set(written)) == total  # every row id traceable
    assert Counter(committed(ckpt)) == Counter(written)
