"""Data served is data written: damaged bytes are never served as 200, never copied on.

Black-box, against real ``tiered serve`` processes whose files are edited by hand:

* hot damage behind the newest snapshot (a sealed segment recovery does not
  scan): reads of the damaged record answer 502 ``DATA_DAMAGED``, reads after it
  are exact, the flusher copies the stream only up to the damage, the segment
  stays, ``tiered verify`` exits 1 naming it, and metrics count it;
* cold damage: every byte of a cold object flipped in turn, with the read cache
  off: each read is exact or 502, never a 500, and every flip inside a byte
  range the read fetched is caught;
* the last acknowledged record with a flipped byte is cut at restart as a torn
  write would be, and the log says what was cut (segment, position, record).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.support.deadlines import scaled
from tests.support.http_helpers import request
from tests.support.server_process import ServerProcess

pytestmark = pytest.mark.timeout(180)

OCTET = {"Content-Type": "application/octet-stream"}
RECORD = 10_000
REPRO = [
    "--segment-bytes",
    "1048576",
    "--max-body-bytes",
    "262144",
    "--flush-interval-s",
    "3600",
    "--flush-bytes",
    "1073741824",
    "--snapshot-every-bytes",
    "200000",
]


def offset(n: int) -> str:
    return f"{n // 10**16:016d}_{n % 10**16:016d}"


def payload(i: int) -> bytes:
    """10 KB that identify record ``i`` wherever they land."""
    head = f"<record {i:05d}>".encode()
    return (head * (RECORD // len(head) + 1))[:RECORD]


def metric(srv: ServerProcess, name: str) -> float:
    status, _, body = request("GET", srv.url + "/metrics")
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def wait_for(cond, what: str, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + scaled(timeout)
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def tiered(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERED_")}
    return subprocess.run(
        [sys.executable, "-m", "tiered.cli", *args], capture_output=True, text=True, timeout=120, env=env
    )


def flip(path: Path, pos: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)
        f.seek(pos)
        f.write(bytes([byte[0] ^ 0x20]))


def test_hot_damage_behind_the_snapshot_is_refused_and_never_copied(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    srv = ServerProcess(data_dir, *REPRO).start()
    url = srv.url + "/v1/stream/victim"
    try:
        assert request("PUT", url, OCTET)[0] == 201
        for i in range(300):
            assert request("POST", url, OCTET, payload(i))[0] == 204
        srv.kill()
        seg1 = data_dir / "hot" / "00000000000000000001.seg"
        raw = seg1.read_bytes()
        victim = 5
        at = raw.index(payload(victim)) + 1234
        flip(seg1, at)

        srv.start()  # the damage lies before every snapshot position: the server starts
        status, headers, body = request("GET", url + "?offset=-1")
        assert status == 502, (status, body[:200])
        assert json.loads(body)["error"]["code"] == "DATA_DAMAGED"
        assert "Retry-After" not in headers  # damage is not an outage
        status, _, body = request("GET", url + f"?offset={offset(victim * RECORD)}")
        assert status == 502
        status, _, body = request("GET", url + f"?offset={offset((victim + 1) * RECORD)}")
        assert status == 200 and body.startswith(payload(victim + 1)), body[:40]
        status, _, body = request("GET", url + f"?offset={offset((victim - 1) * RECORD)}")
        assert status == 502  # the read would run into the damaged record
        assert metric(srv, 'tiered_integrity_errors_total{tier="hot"}') >= 3
        assert srv.stop() == 0

        # Flushing as fast as it can, with hot copies dropped at once: the damage stays home.
        srv.args = [
            *REPRO[:6],
            "--flush-interval-s",
            "0.2",
            "--hot-retention-s",
            "0",
            "--snapshot-every-bytes",
            "200000",
            "--read-chunk-bytes",
            str(RECORD),
        ]
        srv.start()
        wait_for(lambda: metric(srv, "tiered_cold_objects") >= 1, "a cold object")
        wait_for(
            lambda: metric(srv, "tiered_hot_bytes") == (300 - victim) * RECORD,
            "the undamaged prefix to move cold",
        )
        time.sleep(1.0)  # more flush passes: none of them copies past the damage
        assert metric(srv, "tiered_hot_bytes") == (300 - victim) * RECORD
        assert metric(srv, "tiered_cold_flush_damaged_streams") == 1
        for i in range(victim):  # the cold prefix reads exactly, one record per read
            status, headers, body = request(
                "GET", url + ("?offset=-1" if i == 0 else f"?offset={offset(i * RECORD)}")
            )
            assert status == 200 and body == payload(i), (i, status)
            assert headers["Stream-Next-Offset"] == offset((i + 1) * RECORD)
        status, _, _ = request("GET", url + f"?offset={offset(victim * RECORD)}")
        assert status == 502
        status, _, body = request("GET", url + f"?offset={offset(299 * RECORD)}")
        assert status == 200 and body == payload(299)
        assert seg1.exists(), "the segment holding the damage must stay"
        assert srv.stop() == 0
        log = srv.log_path.read_text(errors="replace")
        assert re.search(r"integrity: not copying default/victim from offset 50000", log), log[-3000:]
        for obj in (data_dir / "cold" / "data").glob("*.parquet"):
            table = pq.read_table(obj)
            for start, end in zip(
                table.column("start_offset").to_pylist(), table.column("end_offset").to_pylist(), strict=True
            ):
                assert end <= victim * RECORD, f"{obj.name} holds [{start}, {end}), past the damaged record"

        result = tiered("verify", "--data-dir", str(data_dir))
        assert result.returncode == 1, result.stdout + result.stderr
        assert (
            "hot segment 1 bytes" in result.stdout and "holds default/victim [50000, 60000)" in result.stdout
        ), result.stdout
    except BaseException:
        print(srv.log())
        raise
    finally:
        srv.kill()


def test_every_flipped_byte_of_a_cold_object_is_refused_or_harmless(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    srv = ServerProcess(
        data_dir, "--flush-interval-s", "0.2", "--hot-retention-s", "0", "--read-cache-bytes", "0"
    ).start()
    url = srv.url + "/v1/stream/cold"
    records = [bytes([65 + i]) * 300 for i in range(6)]
    try:
        assert request("PUT", url, OCTET)[0] == 201
        for r in records:
            assert request("POST", url, OCTET, r)[0] == 204
        wait_for(lambda: metric(srv, "tiered_hot_bytes") == 0, "everything to move cold")
        (obj,) = list((data_dir / "cold" / "data").glob("*.parquet"))
        size = obj.stat().st_size
        meta = pq.ParquetFile(obj).metadata
        footer_len = int.from_bytes(obj.read_bytes()[-8:-4], "little") + 8
        fetched = [(size - footer_len, size)]
        for g in range(meta.num_row_groups):
            rg = meta.row_group(g)
            cols = [rg.column(c) for c in range(rg.num_columns)]
            lo = min(c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset for c in cols)
            hi = max(
                (c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset)
                + c.total_compressed_size
                for c in cols
            )
            fetched.append((lo, hi))
        want = b"".join(records)
        answers: dict[int, int] = {}
        for pos in range(size):
            flip(obj, pos)
            try:
                status, headers, body = request("GET", url + "?offset=-1")
            finally:
                flip(obj, pos)
            answers[status] = answers.get(status, 0) + 1
            inside = any(lo <= pos < hi for lo, hi in fetched)
            if inside:
                assert status == 502, f"byte {pos} of {size} (fetched) flipped: {status} {body[:80]!r}"
                assert json.loads(body)["error"]["code"] == "DATA_DAMAGED"
            else:
                assert status == 200 and body == want, f"byte {pos} of {size} (not fetched) flipped: {status}"
        assert set(answers) <= {200, 502} and answers.get(502, 0) > size // 2, answers
        assert metric(srv, 'tiered_integrity_errors_total{tier="cold"}') == answers[502]
        status, _, body = request("GET", url + "?offset=-1")
        assert status == 200 and body == want
    except BaseException:
        print(srv.log())
        raise
    finally:
        srv.kill()


def test_a_cut_acknowledged_record_is_logged(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    srv = ServerProcess(data_dir, "--flush-interval-s", "3600").start()
    url = srv.url + "/v1/stream/tail"
    try:
        assert request("PUT", url, OCTET)[0] == 201
        for i in range(3):
            assert request("POST", url, OCTET, payload(i))[0] == 204
        srv.kill()
        seg = data_dir / "hot" / "00000000000000000001.seg"
        raw = seg.read_bytes()
        assert raw.endswith(payload(2))
        flip(seg, len(raw) - 100)  # inside the last acknowledged record: it now reads as a torn write
        mark = srv.log_path.stat().st_size
        srv.start()
        status, _, body = request("GET", url + "?offset=-1")
        assert status == 200 and body == payload(0) + payload(1)
        with open(srv.log_path, "rb") as f:
            f.seek(mark)
            log = f.read().decode(errors="replace")
        cut = re.search(
            r"recovery cut the tail of segment 1 at byte (\d+): (\d+) bytes \(checksum mismatch[^)]*\); "
            r"held a whole record with a bad checksum: Appended uid=1 offset=20000 10000 data bytes",
            log,
        )
        assert cut, log
        assert int(cut.group(1)) + int(cut.group(2)) == len(raw)
    finally:
        srv.kill()
