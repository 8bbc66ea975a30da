"""The pure parts of a multi-worker node: layouts, each worker's settings, sibling URLs, the metrics merge,
the supervisor's declarations, and the settings' validation."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tiered.cluster.gateway.forward import unix_socket_of, unix_url
from tiered.cluster.membership import keys
from tiered.cluster.membership.cas import MemoryCasStore
from tiered.cluster.membership.heartbeat import HeartbeatBody, Liveness, decode_heartbeat, encode_heartbeat
from tiered.cluster.workers.layout import MARKER, layout_problem, worker_config, worker_id, worker_index
from tiered.cluster.workers.membership import SUPERVISOR, declare_every_alive, declare_gone
from tiered.cluster.workers.metrics import merge_workers
from tiered.core.config import Config, ConfigError, load_config


def test_layouts_refuse_each_other(tmp_path: Path) -> None:
    assert layout_problem(tmp_path, workers=True) is None and layout_problem(tmp_path, workers=False) is None
    (tmp_path / "IDENTITY").write_text("x")
    assert "--workers 1" in (layout_problem(tmp_path, workers=True) or "")
    assert layout_problem(tmp_path, workers=False) is None
    (tmp_path / "IDENTITY").unlink()
    (tmp_path / MARKER).write_text("x")
    assert "--workers N" in (layout_problem(tmp_path, workers=False) or "")
    assert layout_problem(tmp_path, workers=True) is None


def test_worker_ids_and_settings() -> None:
    assert [worker_id(i) for i in range(3)] == ["w0", "w1", "w2"]
    assert [worker_index(n) for n in ("w0", "w12", "w", "x1", "w1a", "")] == [0, 12, None, None, None, None]
    base = Config(workers=4, worker_shards=32, fsync="always", cluster_advertise_url="http://x")
    c = worker_config(base, 3)
    assert (c.cluster_node_id, c.cluster_shards, c.durability, c.workers) == ("w3", 32, "local", 1)
    assert c.cluster_advertise_url == "" and c.fsync == "always" and c.data_dir == base.data_dir


@pytest.mark.parametrize("path", ["/tmp/tiered-workers-x/w0.sock", "/a b/%/w1.sock"])
def test_unix_urls_name_their_socket(path: str) -> None:
    url = unix_url(path)
    assert url.startswith("http+unix://") and "/" not in url[len("http+unix://") :]
    assert unix_socket_of(url) == path
    assert unix_socket_of("http://127.0.0.1:80") is None


W0 = b"""# HELP tiered_appends_total Appends.
# TYPE tiered_appends_total counter
tiered_appends_total{shard="0001"} 3.0
# HELP process_open_fds Open fds.
# TYPE process_open_fds gauge
process_open_fds 12.0
"""
W1 = b"""# HELP tiered_appends_total Appends.
# TYPE tiered_appends_total counter
tiered_appends_total{shard="0002"} 5.0
"""


def test_metrics_merge_labels_every_sample_by_worker() -> None:
    text = merge_workers({"w1": W1, "w0": W0, "w2": None}).decode()
    assert text.count("# TYPE tiered_appends_total counter") == 1
    assert 'tiered_appends_total{shard="0001",worker="w0"} 3.0' in text
    assert 'tiered_appends_total{shard="0002",worker="w1"} 5.0' in text
    assert 'process_open_fds{worker="w0"} 12.0' in text
    assert "tiered_workers 2.0" in text  # w2 did not answer: counted, not hidden
    assert "tiered_workers_scrape_errors_total 1.0" in text


def _beat(cas: MemoryCasStore, node: str, state: Liveness, incarnation: int = 2) -> None:
    body = HeartbeatBody(node, incarnation, state, 7, "n", "http+unix://x")
    asyncio.run(cas.put_if_absent(keys.node_key(node), encode_heartbeat(body)))


def _state(cas: MemoryCasStore, node: str) -> HeartbeatBody:
    return decode_heartbeat(cas.objects[keys.node_key(node)].data, node)


def test_the_supervisor_declares_an_exited_worker_dead() -> None:
    cas = MemoryCasStore()
    _beat(cas, "w0", Liveness.ALIVE)
    _beat(cas, "w1", Liveness.STOPPED)
    assert asyncio.run(declare_gone(cas, "w0")) is True
    body = _state(cas, "w0")
    assert (body.state, body.incarnation, body.declared_by, body.beat) == (Liveness.DEAD, 2, SUPERVISOR, 8)
    assert asyncio.run(declare_gone(cas, "w0")) is False  # already dead: nothing written
    assert asyncio.run(declare_gone(cas, "w1")) is False  # stopped cleanly: left as it is
    assert asyncio.run(declare_gone(cas, "w9")) is False  # never joined
    assert _state(cas, "w1").state is Liveness.STOPPED


def test_at_start_every_worker_still_alive_is_declared_dead() -> None:
    cas = MemoryCasStore()
    for node, state in (("w0", Liveness.ALIVE), ("w1", Liveness.DEAD), ("w2", Liveness.ALIVE)):
        _beat(cas, node, state)
    assert asyncio.run(declare_every_alive(cas)) == ["w0", "w2"]
    assert {_state(cas, n).state for n in ("w0", "w1", "w2")} == {Liveness.DEAD}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"workers": "-1"}, "workers must not be negative"),
        ({"worker_shards": "0"}, "worker_shards must be between 1 and 4096"),
        ({"workers": "2", "http_server": "aiohttp"}, "http_server = 'granian'"),
        (
            {"workers": "2", "cluster_node_id": "n1", "cold_store": "s3", "s3_bucket": "b"},
            "runs as one process",
        ),
    ],
)
def test_worker_settings_are_checked(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, env={}, overrides=overrides)


def test_zero_workers_means_one_per_core() -> None:
    config = load_config(None, env={}, overrides={"workers": "0"})
    assert config.worker_count() == len(os.sched_getaffinity(0))
    assert load_config(None, env={}, overrides={}).worker_count() == 1  # the default: one process
