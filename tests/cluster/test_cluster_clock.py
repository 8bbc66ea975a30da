"""Clock sanity over HTTP (issue 23): a node whose monotonic clock runs twice as fast as real time finds
out from the store's ``Date`` (moto's, real time) and says so in ``/readyz`` (503) and ``/metrics``; the
same node on a true clock stays ready and measures a rate of about 1.

The node runs in this process (a real listener on loopback, a real moto store) so its clock can be
injected; everything is asked over HTTP. The pure scenarios (peers, the majority, no declarations) are
in ``test_cluster_settle.py`` and ``membership/test_clock_check.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster_support import cluster_args, unique_prefix
from tests.support.deadlines import Deadline
from tests.support.metrics_helpers import samples
from tests.support.s3_server import S3Endpoint
from tests.support.server_process import free_port
from tiered.cli.main import build_parser
from tiered.cli.serve import make_listener
from tiered.cluster.compose import build_cluster_handler
from tiered.cluster.server import open_cluster
from tiered.core.clock import SystemClock
from tiered.core.config import Config, load_config

pytestmark = pytest.mark.timeout(300)

TTL = 1.0  # the check needs 10 TTLs of this node's clock between two samples: 5 s of real time at 2x


class ScaledClock(SystemClock):
    """Monotonic time at ``rate`` times real time (wall time true, as a VM's drifting TSC would leave it)."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.origin = time.monotonic()

    def monotonic(self) -> float:
        return self.origin + self.rate * (time.monotonic() - self.origin)


@pytest.fixture(autouse=True)
def _admin_open(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TIERED_ADMIN_TOKEN", raising=False)  # loopback, no token: /metrics open


def _config(s3: S3Endpoint, data_dir: Path, port: int) -> Config:
    argv = ["serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir)]
    argv += cluster_args(s3, unique_prefix("clock"), "n1", shards=2, ttl_s=TTL)
    # Not stretched by the load (``lease_ttl``): one node has no peer to declare it dead, and the check
    # waits 10 TTLs of its clock. A late beat here only closes its own window for a moment.
    argv[argv.index("--cluster-lease-ttl-s") + 1] = str(TTL)
    args = build_parser().parse_args(argv)
    return load_config(args.config, overrides={f.name: getattr(args, f.name, None) for f in fields(Config)})


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def _run_node(config: Config, rate: float) -> tuple[int, dict[str, Any], bytes]:
    """Serve until the clock check has an estimate of the store; then /readyz and /metrics as they are."""
    cluster = await open_cluster(config, ScaledClock(rate))
    listener = make_listener(config, build_cluster_handler(cluster))
    try:
        await listener.start("127.0.0.1", config.port)
        url = f"http://127.0.0.1:{config.port}"
        await cluster.join(url)
        deadline = Deadline(40)
        while not deadline.expired():
            status, body = await asyncio.to_thread(_get, url + "/readyz")
            checks = json.loads(body)["checks"]
            if "store" in checks.get("clock", {}).get("rates", {}) and checks["joined"]:
                break
            await asyncio.sleep(0.2)
        status, body = await asyncio.to_thread(_get, url + "/readyz")
        metrics_status, metrics = await asyncio.to_thread(_get, url + "/metrics")
        assert metrics_status == 200
        return status, json.loads(body), metrics
    finally:
        await cluster.stop()
        await listener.stop()


@pytest.mark.parametrize("rate", [2.0, 1.0], ids=["twice-as-fast", "true"])
def test_readyz_and_metrics_report_a_clock_out_of_the_bound(
    moto_s3: S3Endpoint, tmp_path: Path, rate: float
) -> None:
    config = _config(moto_s3, tmp_path / "n1", free_port())
    status, body, metrics = asyncio.run(_run_node(config, rate))
    clock = body["checks"]["clock"]
    store = clock["rates"]["store"]
    assert clock["bound"] == pytest.approx(0.2)  # the margin over the TTL (a fifth by default)
    out = rate != 1.0
    assert store["low"] <= rate <= store["high"], store
    assert clock["out_of_bound"] is out and store["disagrees"] is out
    assert status == (503 if out else 200) and body["ready"] is (not out)
    found = samples(metrics.decode())
    assert found["tiered_cluster_clock_out_of_bound"] == (1.0 if out else 0.0)
    assert found['tiered_cluster_clock_rate{reference="store"}'] == pytest.approx(rate, rel=0.25)
    # Both shards restored, once per lease won: a beat late under load can lose a lease (the TTL is not
    # stretched here) and the node wins it back with a restore of its own, so count leases, not 2.
    taken = sum(v for k, v in found.items() if k.startswith("tiered_cluster_shards_taken_total{"))
    ended = {
        o: found.get(f'tiered_cluster_restores_total{{outcome="{o}"}}', 0.0)
        for o in ("completed", "abandoned", "failed")
    }
    assert found["tiered_cluster_shards_restoring"] == 0
    assert ended["failed"] == 0 and ended["completed"] >= 2, ended
    assert ended["completed"] + ended["abandoned"] == taken, (ended, taken)
