"""A real ``tiered serve`` SIGKILLed while a writer appends and publishes snapshots as fast as it can.

Each cycle: the writer appends a message, then publishes a snapshot at the new tail, over and
over; at a seeded random moment the server is SIGKILLed (no shutdown snapshot), restarted on
the same data dir, and checked: the newest snapshot is the last acknowledged one or the one in
flight when the kill came (never older, never another body), every acknowledged append is
there byte-exact, and a GC pass with reconciliation (grace 0) leaves exactly one snapshot
object in the store, the one the metadata owns: the interrupted publishes' uploads, if any,
were orphans and are gone. The in-process crash tests (``tests/engine/streams/test_snapshots.py``)
stop the process between each two journaled steps; this one lets the kill fall anywhere.
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pytest

from tests.support.deadlines import scaled, wait_for
from tests.support.http_helpers import request
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(300)

CYCLES = 3
ARGS = ("--gc-grace-s", "0", "--gc-interval-s", "3600", "--flush-interval-s", "0.2", "--hot-retention-s", "0")
NO_TOKEN = {"TIERED_ADMIN_TOKEN": ""}
OCTET = {"Content-Type": "application/octet-stream"}


def snapshot_files(data: Path) -> list[Path]:
    return sorted((data / "cold" / "data").glob("*.snapshot"))


class Writer(threading.Thread):
    """Appends and publishes until the server goes away (bounded: ``limit`` rounds)."""

    def __init__(self, url: str, first: int, limit: int = 2000) -> None:
        super().__init__(daemon=True)
        self.url, self.first, self.limit = url, first, limit
        self.appended: list[bytes] = []  # acknowledged appends, in order
        self.in_flight: bytes | None = None  # the append under way when the server died (may be stored)
        self.attempted: dict[str, bytes] = {}  # snapshot offset -> body sent
        self.acked: list[str] = []  # offsets of acknowledged snapshots

    def run(self) -> None:
        for i in range(self.first, self.first + self.limit):
            message = f"m{i}|".encode()
            try:
                self.in_flight = message
                status, headers, _ = request("POST", self.url, OCTET, message, timeout=5)
                if status != 204:
                    return
                self.in_flight = None
                self.appended.append(message)
                tail = headers["Stream-Next-Offset"]
                body = f"state-{i}".encode() * (1 + i % 7)
                self.attempted[tail] = body
                status, _, _ = request("PUT", f"{self.url}?snapshot={tail}", OCTET, body, timeout=5)
                if status != 204:
                    return
                self.acked.append(tail)
            except OSError:
                return


def test_sigkill_while_publishing_snapshots(tmp_path: Path) -> None:
    data = tmp_path / "data"
    rng = random.Random(2121)
    srv = ServerProcess(data, *ARGS, env=NO_TOKEN).start()
    url = f"{srv.url}/v1/stream/doc"
    try:
        assert request("PUT", url, OCTET, b"")[0] == 201
        appended: list[bytes] = []
        unacknowledged: set[bytes] = set()  # appends whose answer the kill cut off: stored or not
        attempted: dict[str, bytes] = {}
        acked: list[str] = []
        for cycle in range(CYCLES):
            writer = Writer(url, first=cycle * 10_000)
            writer.start()
            wanted = rng.randint(3, 25)
            wait_for(lambda w=writer, n=wanted: len(w.acked) >= n, 60, f"{wanted} acknowledged snapshots")
            time.sleep(rng.random() * 0.05)
            srv.kill()
            writer.join(scaled(15))
            appended += writer.appended
            if writer.in_flight is not None:
                unacknowledged.add(writer.in_flight)
            attempted.update(writer.attempted)
            acked += writer.acked
            srv = ServerProcess(data, *ARGS, env=NO_TOKEN).start()
            url = f"{srv.url}/v1/stream/doc"
            status, headers, _ = request("HEAD", url)
            assert status == 200
            newest = headers["Stream-Snapshot-Offset"]
            assert newest >= acked[-1]  # offsets of one stream compare as strings (fixed width)
            status, _, body = request("GET", f"{url}?offset={newest}_snapshot")
            assert (status, body) == (200, attempted[newest])
            status, _, content = request("GET", f"{url}?offset=-1")
            assert status == 200
            stored = [m + b"|" for m in content.split(b"|")[:-1]]
            # Every acknowledged append, in order; nothing else but appends the kill cut off.
            assert [m for m in stored if m not in unacknowledged] == appended

            def collected(base: str = srv.url) -> bool:
                # The flusher aborts interrupted copies as it starts; until then their keys are known.
                status, _, raw = request("POST", f"{base}/v1/admin/gc")
                report = json.loads(raw)
                assert status == 200 and report["integrity_errors"] == [], report
                return len(snapshot_files(data)) == 1

            wait_for(collected, 30, "GC to leave only the owned snapshot object")
            [left] = snapshot_files(data)
            assert left.read_bytes() == attempted[newest]
    finally:
        srv.stop()
