"""``tiered serve --workers 2`` as a black box: every feature, crashes of one worker and of the node, metrics,
shutdown.

The node is real processes on the loopback: a supervisor and two workers
sharing the port (``SO_REUSEPORT``), so a request lands on either worker and
about half of them are forwarded to the sibling that serves their shard over
its Unix socket. Appends carry producer headers, so the client's retry of an
append whose answer a crash cut off is deduplicated (exactly-once), and each
test compares every stream byte for byte with the appends that were
acknowledged.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.api.test_conformance import EXPECTED_PASSED_WITH_SUBSCRIPTIONS, run_suite
from tests.support.deadlines import Deadline, scaled, wait_for
from tests.support.http_helpers import create, read, read_all, request, stream_url, unique
from tests.support.s3_ops import tiered_command
from tests.support.server_process import ServerProcess

WORKERS = ("--workers", "2", "--worker-shards", "8")


def _node(data: Path, *extra: str) -> ServerProcess:
    return ServerProcess(data, *WORKERS, "--long-poll-timeout-s", "3", *extra)


def _log(srv: ServerProcess) -> str:
    return srv.log_path.read_text(errors="replace")


def _start(node: ServerProcess) -> ServerProcess:
    """Start the node and wait for the supervisor's ``tiered listening on``: every worker then serves the
    port (``/healthz`` answers as soon as one does, while its sibling may still be settling)."""
    before = _log(node).count("tiered listening on") if node.log_path.exists() else 0
    node.start(timeout=60)
    wait_for(lambda: _log(node).count("tiered listening on") > before, 60, "every worker to listen")
    return node


def _pids(srv: ServerProcess) -> dict[str, int]:
    """Each worker's latest pid, from the supervisor's log."""
    return {w: int(p) for w, p in re.findall(r"worker (w\d+) started \(pid (\d+)\)", _log(srv))}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"


def _metric(text: str, name: str) -> dict[str, float]:
    """``name``'s samples by their ``worker`` label."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(rf'{name}\{{(?:.*,)?worker="(w\d+)"(?:,.*)?\}} (\S+)$', line)
        if m:
            found[m.group(1)] = found.get(m.group(1), 0.0) + float(m.group(2))
    return found


class Appender:
    """One producer per stream; each append retried (same seq) until acknowledged, within a deadline."""

    def __init__(self, srv: ServerProcess, streams: list[str]) -> None:
        self.srv = srv
        self.streams = streams
        self.acked: dict[str, list[bytes]] = {s: [] for s in streams}
        self.retries = 0

    def append(self, k: int) -> None:
        name = self.streams[k % len(self.streams)]
        seq = len(self.acked[name])
        body = f"[{name}:{seq}:{'x' * (k % 7)}]".encode()
        headers = {
            "Content-Type": "application/octet-stream",
            "Producer-Id": f"p-{name}",
            "Producer-Epoch": "0",
            "Producer-Seq": str(seq),
        }
        deadline = Deadline(60)
        while True:
            try:
                status, _, resp = request("POST", stream_url(self.srv.url, name), headers, body, timeout=10)
            except OSError:
                status, resp = 0, b""  # the worker holding the connection died: outcome unknown, retry
            if status in (200, 204):
                self.acked[name].append(body)
                return
            assert status in (0, 503), (status, resp)
            assert not deadline.expired(), f"append {k} never acknowledged (last: {status} {resp!r})"
            self.retries += 1
            time.sleep(0.1)

    def check(self) -> None:
        """Every stream reads back exactly what was acknowledged. A 503 + Retry-After is an answer a client
        retries (a shard handed back to a restarted worker answers it on its sibling until the sibling's
        view sees the new owner, a heartbeat later), so the read is retried within a deadline."""
        for name in self.streams:
            data = wait_for(lambda name=name: self._read(name), 30, f"{name} to be readable")
            assert data == b"".join(self.acked[name]), name

    def _read(self, name: str) -> bytes | None:
        out, offset = bytearray(), "-1"
        for _ in range(10_000):
            status, headers, body = read(stream_url(self.srv.url, name), offset)
            if status == 503:  # the shard moving (SHARD_NOT_OWNED, Retry-After): retried
                return None
            assert status == 200, (status, body)
            out += body
            offset = headers["Stream-Next-Offset"]
            if headers.get("Stream-Up-To-Date") == "true":
                return bytes(out)
        raise AssertionError(f"{name}: no end after 10,000 reads")


def _streams(srv: ServerProcess, count: int) -> list[str]:
    names = [unique("w") for _ in range(count)]
    for name in names:
        status, _, body = create(stream_url(srv.url, name))
        assert status == 201, body
    return names


def _served(srv: ServerProcess) -> dict[str, float]:
    status, _, body = request("GET", srv.url + "/metrics")
    assert status == 200, body
    return _metric(body.decode(), "tiered_cluster_shards_served")


@pytest.mark.conformance
def test_conformance_suite_against_two_workers(conformance_suite: Path, tmp_path: Path) -> None:
    """The whole official suite, subscriptions included, against a two-worker node."""
    srv = _start(_node(tmp_path / "data", "--webhook-allow-loopback", "true"))
    try:
        passed, failed, out = run_suite(
            conformance_suite, srv.url, env={"CONFORMANCE_SUBSCRIPTIONS": "1"}, test_timeout_s=15
        )
    finally:
        assert srv.stop() == 0, srv.log()
    failures = "\n".join(line for line in out.splitlines() if "FAIL" in line or " × " in line)
    assert failed == 0, f"{failed} conformance tests failed:\n{failures}"
    assert passed == EXPECTED_PASSED_WITH_SUBSCRIPTIONS, out[-3000:]


def test_sigkill_of_one_worker_loses_nothing(tmp_path: Path) -> None:
    srv = _start(_node(tmp_path / "data"))
    try:
        served = _served(srv)
        assert set(served) == {"w0", "w1"} and sum(served.values()) == 8, served
        appender = Appender(srv, _streams(srv, 8))
        for k in range(40):
            appender.append(k)
        victim = _pids(srv)["w1"]
        os.kill(victim, signal.SIGKILL)
        for k in range(40, 120):  # through the crash: the sibling takes w1's shards, w1 comes back
            appender.append(k)
        wait_for(lambda: _pids(srv)["w1"] != victim, 30, "the supervisor to restart w1")
        wait_for(lambda: _log(srv).count("worker w1 listening") == 2, 60, "the new w1 to listen")
        wait_for(lambda: _served(srv) == served, 60, "w1 to take its shards back")
        for k in range(120, 160):
            appender.append(k)
        appender.check()
        assert f"worker w1 (pid {victim}) exited with -9; restarting it" in _log(srv)
        assert "declared dead" in _log(srv)
        assert not _alive(victim)
    finally:
        assert srv.stop() == 0, srv.log()


def test_sigkill_of_the_whole_node_loses_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    srv = _start(_node(data))
    appender = Appender(srv, _streams(srv, 8))
    for k in range(80):
        appender.append(k)
    pids = _pids(srv)
    srv.kill()  # SIGKILL to the node's process group: supervisor and workers at once
    wait_for(lambda: not any(_alive(p) for p in pids.values()), 10, "every worker to be gone")
    again = _start(_node(data))
    try:
        appender.srv = again
        appender.check()  # every acknowledged append, byte-exact, after recovery from the shards' journals
        for k in range(80, 120):
            appender.append(k)
        appender.check()
        assert "workers of an earlier run declared dead" in _log(again)
    finally:
        assert again.stop() == 0, again.log()


def test_metrics_aggregate_every_worker_and_shutdown_is_clean(tmp_path: Path) -> None:
    srv = _start(_node(tmp_path / "data"))
    appender = Appender(srv, _streams(srv, 8))
    for k in range(16):
        appender.append(k)
    status, headers, body = request("GET", srv.url + "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain"), body
    text = body.decode()
    assert "tiered_workers 2.0" in text and "tiered_workers_scrape_errors_total 0.0" in text
    assert set(_metric(text, "process_cpu_seconds_total")) == {"w0", "w1"}
    assert sum(_served(srv).values()) == 8
    # every answer one worker gave, and the appends forwarded to their shard's worker, are in one scrape
    # (which worker the kernel hands each connection is its choice: under load one worker may have
    # taken them all, so the sum is what is exact, not the split)
    requests = _metric(text, "tiered_http_requests_total")
    assert set(requests) <= {"w0", "w1"} and sum(requests.values()) >= 24, requests
    pids = _pids(srv)
    assert srv.stop() == 0, srv.log()
    assert not any(_alive(p) for p in pids.values())
    log = _log(srv)
    assert "all workers stopped" in log and "Traceback" not in log, log[-3000:]


def test_a_data_dir_keeps_its_layout(tmp_path: Path) -> None:
    """A single process's data dir is refused by workers and a workers' data dir by a single process (exit 2):
    neither would see the other's streams."""
    single, multi = tmp_path / "single", tmp_path / "multi"
    srv = ServerProcess(single).start()
    name = unique("keep")
    assert create(stream_url(srv.url, name))[0] == 201
    assert srv.stop() == 0
    refused = subprocess.run(
        [*tiered_command(), "serve", "--port", "1", "--data-dir", str(single), *WORKERS],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert refused.returncode == 2 and "holds a single-process node's data" in refused.stderr, refused
    srv = _start(_node(multi))
    assert srv.stop() == 0
    refused = subprocess.run(
        [*tiered_command(), "serve", "--port", "1", "--data-dir", str(multi)],
        capture_output=True,
        text=True,
        timeout=scaled(60),
    )
    assert refused.returncode == 2 and "holds a multi-worker node's data" in refused.stderr, refused
    again = ServerProcess(single).start()
    try:
        assert read_all(stream_url(again.url, name))[0] == b""
    finally:
        assert again.stop() == 0
