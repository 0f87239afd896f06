import os
import sys
import threading

import pytest

from etl.errors import ConfigError
from etl.runtime.cluster import SCHEDULER_ENV, cluster_spec, connect, connecting


def test_spec_given_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv(SCHEDULER_ENV, "tcp://10.0.0.1:8786")
    assert cluster_spec("local:3") == "local:3"
    assert cluster_spec(None) == "tcp://10.0.0.1:8786"


def test_no_spec_and_no_environment_means_threads(monkeypatch):
    monkeypatch.delenv(SCHEDULER_ENV, raising=False)
    assert cluster_spec(None) is None
    with connect(None) as client:
        assert client is None


@pytest.mark.parametrize("spec", ["local:0", "local:", "local:x", "local", "8786", "host:8786", "tcp://"])
def test_bad_specs_are_named(spec):
    with pytest.raises(ConfigError, match="--cluster"):
        cluster_spec(spec)


def test_unreachable_scheduler_is_a_config_error():
    with pytest.raises(ConfigError, match="cannot reach"), connect("tcp://127.0.0.1:9", timeout=1):
        pass


def test_local_cluster_runs_tasks_in_other_processes_and_stops():
    with connect("local:2") as client:
        assert client is not None
        pids = set(client.gather(client.map(lambda i: os.getpid(), range(8), pure=False)))
        assert os.getpid() not in pids
        assert len(client.scheduler_info()["workers"]) == 2
    assert client.status == "closed"


def test_connecting_without_a_cluster_starts_no_thread(monkeypatch):
    monkeypatch.delenv(SCHEDULER_ENV, raising=False)
    before = threading.active_count()
    with connecting(None) as client:
        assert threading.active_count() == before
        assert client() is None


def test_connecting_raises_a_bad_spec_at_once():
    with pytest.raises(ConfigError, match="--cluster 'local:0'"), connecting("local:0"):
        pytest.fail("the block ran")


def test_connecting_hands_over_what_the_start_raised():
    with connecting("tcp://127.0.0.1:9", timeout=1) as client, pytest.raises(ConfigError, match="cannot reach"):
        client()


def test_connecting_starts_a_local_cluster_in_the_background_and_closes_it_after_an_error():
    with pytest.raises(RuntimeError, match="in the block"), connecting("local:1") as client:
        started = client()
        assert started is not None
        # the preload imported etl's task modules in the worker, while the cluster started
        assert started.run(lambda: "etl.preprocess.tasks" in sys.modules) == {w: True for w in started.scheduler_info()["workers"]}
        raise RuntimeError("in the block")
    assert started.status == "closed"
    assert not any(t.name == "etl-cluster" for t in threading.enumerate())
