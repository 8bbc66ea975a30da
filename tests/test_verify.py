"""``tiered verify`` against a real data dir: clean, corrupted, and missing objects."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from .http_helpers import request
from .server_process import ServerProcess


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
        deadline = time.monotonic() + 20
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
