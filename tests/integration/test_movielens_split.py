"""The README's "Honest evaluation" commands on MovieLens (etl preprocess --split in a subprocess) against plain-
Python references built from ratings.csv and movies.csv: each split's rows, ids from vocabularies counted on the
train rows only (unseen values on the out-of-vocabulary id), the timestamp standardised with the train rows' mean
and std, the values train never saw; the same bytes with one worker or two; by each user's latest ratings with
History over the whole timeline; one-line errors for a bad --split and for etl fit of a pipeline with a split."""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from etl.backends.hashing import string_key
from etl.io.processed import Unseen, open_processed, read_manifest
from etl.loader import Loader
from etl.pipeline import Pipeline
from etl.preprocess import preprocess
from tests.conftest import REPO, run_etl
from tests.docs import section_commands
from tests.integration.test_movielens import joined_rows, vocab_ids

ROLES = ("train", "valid", "test")


@pytest.fixture(scope="module")
def readme_run(movielens: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[str]]]:
    """The README's commands run once for the tests of this module: their directory, and the commands."""
    tmp_path = tmp_path_factory.mktemp("readme")
    return tmp_path, run_readme(movielens, tmp_path)


def run_readme(movielens: Path, tmp_path: Path) -> list[list[str]]:
    convert = section_commands("MovieLens")[0]
    commands = section_commands("A split on MovieLens")
    assert [c[:2] for c in commands] == [["etl", "preprocess"], ["etl", "inspect"], ["etl", "preprocess"]]
    printed = []
    for command in (convert, *commands):
        printed.append(run_etl(*(a.replace("ml-latest-small/", f"{movielens}/").replace("data/ml/", f"{tmp_path}/ml/") for a in command[1:])).stdout)
    summary, inspected = printed[1], printed[2]
    for role in ROLES:  # the summary: per split, its rows and rule, its row accounting, the values train never saw
        assert re.search(rf"^{role}: [\d,]+ rows \(.*timestamp.*\) → {tmp_path}/ml/split/{role}$", summary, re.M), summary
    assert summary.count("  rows: 100,836 in = ") == 3 and summary.count("never seen in train: userId") == 2
    assert "split: test" in inspected and "never seen in train: userId" in inspected
    return commands


def output(directory: Path) -> list[dict]:
    return [r for p in open_processed(directory).parts for r in pq.read_table(p).to_pylist()]


def digests(directory: Path) -> dict[str, str]:
    return {str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.rglob("*")) if p.is_file()}


def test_time_split_of_the_readme(movielens: Path, readme_run: tuple[Path, list[list[str]]], tmp_path: Path) -> None:
    ran, commands = readme_run
    split = yaml.safe_load(commands[0][commands[0].index("--split") + 1])
    out = ran / "ml" / "split"
    rows = joined_rows(movielens)
    role = ["train" if r["timestamp"] < split["train_until"] else "valid" if r["timestamp"] < split["valid_until"] else "test" for r in rows]
    train = [r for r, k in zip(rows, role) if k == "train"]
    users = vocab_ids([r["userId"] for r in train])
    movies = vocab_ids([r["movieId"] for r in train])
    first3 = [[] if r["genres"] is None else r["genres"].split("|")[:3] for r in rows]
    genres = vocab_ids([g for gs, k in zip(first3, role) if k == "train" for g in gs], key=lambda g: string_key(g.encode()))
    ts = np.array([float(r["timestamp"]) for r in train])
    for name in ROLES:
        mine = [i for i, k in enumerate(role) if k == name]
        got = output(out / name)
        assert len(got) == len(mine) > 1000
        assert [g["rating"] for g in got] == [float(rows[i]["rating"]) for i in mine]
        assert [g["userId"] for g in got] == [users.get(rows[i]["userId"], 2) for i in mine]
        assert [g["movieId"] for g in got] == [movies.get(rows[i]["movieId"], 2) for i in mine]
        assert [g["genres"] for g in got] == [[genres.get(x, 2) for x in first3[i]] for i in mine]
        want = ((np.array([float(rows[i]["timestamp"]) for i in mine]) - ts.mean()) / ts.std()).astype(np.float32)
        np.testing.assert_allclose([g["timestamp"] for g in got], want, rtol=1e-5, atol=1e-6)
        report = read_manifest(out / name).split
        assert report is not None and report.rows == len(mine)
        if name != "train":
            vocabs = {"userId": users, "movieId": movies, "genres": genres}
            expected = []
            for c in ("userId", "movieId", "genres"):
                values = [first3[i] if c == "genres" else [rows[i][c]] for i in mine]
                unseen = [[v for v in vs if v not in vocabs[c]] for vs in values]
                expected.append(Unseen(c, sum(1 for u in unseen if u), len({v for u in unseen for v in u})))
            assert report.unseen == tuple(expected) and report.unseen[0].rows > 0
        batches = list(Loader(out / name, batch_size=8192))
        assert sum(len(b.label) for b in batches) == len(mine)
    # the same bytes with one worker (the README's run has two), through the Python API
    one = tmp_path / "one"
    preprocess(Pipeline.from_file(REPO / "pipelines/movielens.yaml"), sorted((ran / "ml/raw").glob("*.parquet")), one, workers=1,
               split=commands[0][commands[0].index("--split") + 1])  # fmt: skip
    for name in ROLES:
        assert digests(one / name) == digests(out / name)


def test_each_users_latest_ratings_with_history(movielens: Path, readme_run: tuple[Path, list[list[str]]]) -> None:
    out = readme_run[0] / "ml" / "last"
    rows = joined_rows(movielens)
    by_user: dict[int, list[int]] = defaultdict(list)
    for i, r in enumerate(rows):
        by_user[r["userId"]].append(i)
    role: dict[int, str] = {}
    for members in by_user.values():
        ordered = sorted(members, key=lambda i: (rows[i]["timestamp"], i))
        for rank, i in enumerate(reversed(ordered)):
            role[i] = "test" if rank == 0 else "valid" if rank == 1 else "train"
    users = vocab_ids([rows[i]["userId"] for i in role if role[i] == "train"])
    movies = vocab_ids([rows[i]["movieId"] for i in role if role[i] == "train"])
    history = {}  # over every rating: the movies of the user's strictly earlier ratings, the latest 50
    for members in by_user.values():
        ordered = sorted(members, key=lambda i: (rows[i]["timestamp"], i))
        for i in ordered:
            history[i] = [movies.get(rows[j]["movieId"], 2) for j in ordered if rows[j]["timestamp"] < rows[i]["timestamp"]][-50:]
    for name in ROLES:
        want = sorted((users.get(rows[i]["userId"], 2), movies.get(rows[i]["movieId"], 2), float(rows[i]["rating"]), history[i])
                      for i in role if role[i] == name)  # fmt: skip
        got = sorted((g["userId"], g["movieId"], g["rating"], g["hist_movieId"]) for g in output(out / name))
        assert got == want
    assert len(want) == len(by_user)  # one test rating per user


def test_a_bad_split_and_etl_fit_of_a_split_are_one_line(movielens: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw"
    run_etl("convert", movielens / "ratings.csv", "--join", movielens / "movies.csv", "--on", "movieId", "--schema", REPO / "schemas/movielens.yaml",
            "--out", raw)  # fmt: skip
    proc = run_etl("preprocess", "--pipeline", REPO / "pipelines/movielens.yaml", "--input", raw, "--out", tmp_path / "out",
                   "--split", "{by: time, column: timestamp, train_until: 2.5}", check=False)  # fmt: skip
    assert proc.returncode == 2
    problem = "2.5 is not an integer, the type of column 'timestamp' (int64)"
    assert proc.stderr.strip().splitlines() == [f"error: --split: field 'split.train_until': {problem}"]
    doc = yaml.safe_load((REPO / "pipelines/movielens.yaml").read_text())  # the same document, with a split
    doc["split"] = {"by": "time", "column": "timestamp", "train_until": {"quantile": 0.8}}
    for d in ("pipelines", "schemas"):
        (tmp_path / d).mkdir()
    (tmp_path / "schemas/movielens.yaml").write_text((REPO / "schemas/movielens.yaml").read_text())
    (tmp_path / "pipelines/p.yaml").write_text(yaml.safe_dump(doc))
    proc = run_etl("fit", "--pipeline", tmp_path / "pipelines/p.yaml", "--input", raw, "--artifacts", tmp_path / "art", check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1 and "has a split: etl preprocess fits its statistics" in proc.stderr
    run_etl("fit", "--pipeline", REPO / "pipelines/movielens.yaml", "--input", raw, "--artifacts", tmp_path / "art")
    proc = run_etl("preprocess", "--pipeline", tmp_path / "pipelines/p.yaml", "--input", raw, "--out", tmp_path / "out", "--artifacts",
                   tmp_path / "art", check=False)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "a split run fits its statistics on its train rows" in proc.stderr
