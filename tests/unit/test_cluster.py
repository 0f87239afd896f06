import os

import pytest

from etl.cluster import SCHEDULER_ENV, cluster_spec, connect
from etl.errors import ConfigError


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
