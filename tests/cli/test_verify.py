"""``tiered verify`` against a real data dir: clean, corrupted, and missing objects.

On the local store, and on every S3 store of ``tests/support/s3_backends.py`` together with
the offline GC's reconciliation (an orphan deleted, a missing object reported).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.deadlines import scaled
from tests.support.http_helpers import request
from tests.support.s3_backends import ALL, S3Backend
from tests.support.s3_ops import tiered_command
from tests.support.server_process import ServerProcess


def _flushed_data_dir(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    srv = ServerProcess(data, "--flush-interval-s", "0.05", "--hot-retention-s", "0").start()
    try:
        for i in range(20):
            url = f"{srv.url}/v1/stream/verify-{i}"
            assert request("PUT", url, {"Content-Type": "application/octet-stream"})[0] == 201
            for j in range(5):
                body = bytes([i, j]) * (100 + 37 * j)
                assert request("POST", url, {"Content-Type": "application/octet-stream"}, body)[0] == 204
        deadline = time.monotonic() + scaled(20)
        while time.monotonic() < deadline and not list((data / "cold" / "data").glob("*.parquet")):
            time.sleep(0.1)
        time.sleep(0.5)  # let the last pass commit
    finally:
        assert srv.stop() == 0
    assert list((data / "cold" / "data").glob("*.parquet"))
    return data


def _verify(data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tiered.cli", "verify", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_verify_passes_then_catches_corruption_and_missing_objects(tmp_path: Path) -> None:
    data = _flushed_data_dir(tmp_path)
    ok = _verify(data)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "errors:           0" in ok.stdout
    assert "stream ranges:" in ok.stdout

    objects = sorted((data / "cold" / "data").glob("*.parquet"))
    victim = objects[0]
    original = victim.read_bytes()
    corrupted = bytearray(original)
    corrupted[len(corrupted) // 3] ^= 0xFF
    victim.write_bytes(bytes(corrupted))
    bad = _verify(data)
    assert bad.returncode == 1
    assert f"ERROR data/{victim.name}" in bad.stdout

    victim.unlink()
    missing = _verify(data)
    assert missing.returncode == 1
    assert "missing from the object store" in missing.stdout


# --------------------------------------------------------------------------- on every S3 store


def _tiered(backend: S3Backend, *args: str) -> subprocess.CompletedProcess[str]:
    """``tiered`` with the backend's credentials in the environment (nothing secret on the command line)."""
    return subprocess.run(
        [*tiered_command(), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **backend.env},
    )


def _report_rows(stdout: str) -> dict[str, int]:
    rows = {}
    for line in stdout.splitlines():
        name, _, value = line.rpartition("  ")
        if name.strip() and value.strip().isdigit():
            rows[name.strip()] = int(value.strip())
    return rows


@pytest.mark.parametrize("s3_backend", ALL, indirect=True)
def test_verify_and_reconciliation_on_s3(s3_backend: S3Backend, tmp_path: Path) -> None:
    """``tiered verify`` and an offline ``tiered gc`` (reconciliation) on every S3 store: on moto-iam
    as a user holding only iam.tf's policy, on Ceph over HTTPS through ``--s3-ca-bundle``."""
    data = tmp_path / "data"
    store_args = s3_backend.serve_args()
    srv = ServerProcess(
        data, "--flush-interval-s", "0.05", "--hot-retention-s", "0", *store_args, env=s3_backend.env
    ).start()
    try:
        for i in range(10):
            url = f"{srv.url}/v1/stream/verify-{i}"
            assert request("PUT", url, {"Content-Type": "application/octet-stream"})[0] == 201
            for j in range(3):
                body = bytes([i, j]) * (100 + 37 * j)
                assert request("POST", url, {"Content-Type": "application/octet-stream"}, body)[0] == 204
        deadline = time.monotonic() + scaled(20)
        while not s3_backend.keys("data/"):
            assert time.monotonic() < deadline, f"nothing reached the store:\n{srv.log()}"
            time.sleep(0.1)
        time.sleep(0.5)  # let the last pass commit
    finally:
        assert srv.stop() == 0, srv.log()
    keys = sorted(s3_backend.keys("data/"))
    assert keys and not (data / "cold" / "data").exists()

    ok = _tiered(s3_backend, "verify", "--data-dir", str(data), *store_args)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "errors:           0" in ok.stdout and f"objects verified: {len(keys)}" in ok.stdout

    # Reconciliation: an object nobody committed (a ULID from 2016) is found and deleted.
    stray = "data/01ARZ3NDEKTSV4RRFFQ69G5FAV.parquet"
    s3_backend.write(stray, b"not committed")
    done = _tiered(s3_backend, "gc", "--data-dir", str(data), "--gc-grace-s", "0", *store_args)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _report_rows(done.stdout)
    assert (rows["orphans found"], rows["orphans deleted"], rows["errors"]) == (1, 1, 0), done.stdout
    assert sorted(s3_backend.keys("data/")) == keys

    victim = keys[0]
    damaged = bytearray(s3_backend.read(victim))
    damaged[len(damaged) // 3] ^= 0xFF
    s3_backend.write(victim, bytes(damaged))
    bad = _tiered(s3_backend, "verify", "--data-dir", str(data), *store_args)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert f"ERROR {victim}" in bad.stdout

    s3_backend.remove(victim)
    missing = _tiered(s3_backend, "verify", "--data-dir", str(data), *store_args)
    assert missing.returncode == 1
    assert f"{victim}: missing from the object store (metadata references it)" in missing.stdout
    done = _tiered(s3_backend, "gc", "--data-dir", str(data), *store_args)
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        f"INTEGRITY ERROR: {victim}: referenced by metadata but missing from the object store" in done.stdout
    )
