"""Large bodies with the other features of issue 22 over HTTP, then ``tiered verify`` on the data dir.

A real ``tiered serve`` with a low large-body threshold: a body above it is
stored by reference, and still

* honours ``Stream-Expected-Offset`` and ``Stream-Record-Match`` (412, nothing
  stored, no payload object left);
* is one message: ``HEAD``'s ``Stream-Record-Count``, ``?record=N``, the
  listing's ``records``, and ``size_bytes`` counting its bytes;
* is one record of ``Stream-Integrity`` (the digest a client computes with
  ``tiered.core.record_digest`` over what it appended);

and ``tiered verify`` passes on the data dir after a SIGTERM, and fails naming
the stream once a bit of the body's object is flipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.http_helpers import append, create, error_code, head, read, request, stream_url, unique
from tests.support.server_process import ServerProcess
from tiered.core.ids import format_offset
from tiered.core.record_digest import MASK, format_digest, record_hash

pytestmark = pytest.mark.timeout(120)

THRESHOLD = 64 * 1024
OCTET = "application/octet-stream"


def tiered(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERED_")}
    return subprocess.run(
        [sys.executable, "-m", "tiered.cli", *args], capture_output=True, text=True, timeout=120, env=env
    )


def payload_files(data_dir: Path) -> list[Path]:
    root = data_dir / "cold" / "data"
    return sorted(root.glob("*.payload")) if root.exists() else []


def integrity_fields(value: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in value.split(";") if part)


def test_a_large_body_with_conditions_ordinals_listing_digests_and_verify(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    srv = ServerProcess(data_dir, "--large-body-threshold-bytes", str(THRESHOLD)).start()
    name = unique()
    url = stream_url(srv.url, name)
    head_part, big, tail_part = b"head;", os.urandom(THRESHOLD + 4321), b"tail;"
    try:
        assert create(url, OCTET, head_part)[0] == 201
        for wrong in ({"Stream-Expected-Offset": format_offset(0)}, {"Stream-Record-Match": "0"}):
            status, headers, body = append(url, big, **wrong)
            assert (status, error_code(body)) == (412, "TAIL_MISMATCH"), wrong
        assert payload_files(data_dir) == []  # refused before a byte was stored
        status, _, body = append(
            url,
            big,
            **{"Stream-Expected-Offset": format_offset(len(head_part)), "Stream-Record-Match": "1"},
        )
        assert status == 204, body
        assert len(payload_files(data_dir)) == 1
        assert append(url, tail_part, **{"Stream-Record-Match": "2"})[0] == 204

        total = len(head_part) + len(big) + len(tail_part)
        status, headers, _ = head(url)
        assert status == 200
        assert headers["Stream-Record-Count"] == "3" and headers["Stream-Record-Next"] == "3"
        starts = [0, len(head_part), len(head_part) + len(big)]
        parts = [head_part, big, tail_part]
        want = sum(record_hash("default", name, 0, s, p) for s, p in zip(starts, parts, strict=True)) & MASK
        got = integrity_fields(headers["Stream-Integrity"])
        assert (got["live"], got["live-records"], got["live-bytes"]) == (format_digest(want), "3", str(total))

        status, headers, body = read(url, record="1")
        assert status == 200 and headers["Stream-Record"] == "1" and body.startswith(big[:1000])

        status, _, raw = request("GET", f"{srv.url}/v1/stream?prefix={name}")
        assert status == 200, raw
        [entry] = json.loads(raw)["streams"]
        assert (entry["size_bytes"], entry["records"]) == (total, 3)
    finally:
        srv.stop()

    result = tiered("verify", "--data-dir", str(data_dir))
    assert result.returncode == 0, result.stdout + result.stderr
    [payload] = payload_files(data_dir)
    raw_payload = bytearray(payload.read_bytes())
    raw_payload[len(raw_payload) // 2] ^= 0x04
    payload.write_bytes(bytes(raw_payload))
    result = tiered("verify", "--data-dir", str(data_dir))
    assert result.returncode == 1, result.stdout
    assert f"default/{name} [{len(head_part)}, {len(head_part) + len(big)})" in result.stdout, result.stdout
