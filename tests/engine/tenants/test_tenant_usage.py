"""Usage accounting: counters are journal state that equal what was acknowledged, and survive everything.

* appended bytes and records are counted where the records are applied: a
  retry through an idempotent producer counts once, a create with a body
  counts, replay and snapshots neither lose nor double anything;
* egress by tier and requests by class are counted in memory and journaled
  by ``record_usage`` (a crash loses only what was not recorded yet);
* counters outlive an erased bucket; the usage API and metrics show them,
  metrics with a capped number of bucket labels;
* the usage log has one line per bucket per interval, written after the
  counters are durable, rotated by size and by age;
* token secrets never reach the journal or snapshots (their bytes are read);
* SIGKILL under idempotent producers that retry until acknowledged: the
  counters equal the acknowledged work exactly.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.auth_support import OPERATOR, AuthServer, bearer
from tests.support.deadlines import scaled
from tests.support.gc_support import HttpHarness, VirtualClock, make_config
from tests.support.http_helpers import request
from tests.support.metrics_helpers import samples
from tiered.engine.streams.model import AppendRequest

pytestmark = pytest.mark.timeout(300)
OCTET = {"Content-Type": "application/octet-stream"}


def on_harness(body: Callable[[HttpHarness], Awaitable[None]], **config: Any) -> Callable[[Path], None]:
    def test(tmp_path: Path) -> None:
        async def main() -> None:
            h = HttpHarness(make_config(tmp_path / "data", **config), clock=VirtualClock())
            await h.start()
            try:
                await h.bucket("acme")
                await body(h)
            finally:
                await h.stop()

        asyncio.run(main())

    test.__name__ = body.__name__
    test.__doc__ = body.__doc__
    return test


async def usage(h: HttpHarness, bucket: str = "acme") -> dict[str, Any]:
    status, _, body = await h.http("GET", f"/v1/admin/usage?bucket={bucket}")
    assert status == 200, body
    [row] = json.loads(body)["buckets"]
    return row


@on_harness
async def test_appends_count_once_even_when_a_producer_retries(h: HttpHarness) -> None:
    await h.create("acme", "s", b"12345")  # a create with a body counts
    streams = h.s.streams
    req = AppendRequest("application/octet-stream", b"abc", False, "p1", 0, 0)
    assert (await streams.append("acme", "s", req)).stored
    assert (await streams.append("acme", "s", req)).duplicate  # the retry: nothing stored, nothing counted
    close = AppendRequest(None, b"", True)
    await streams.append("acme", "s", close)  # close-only stores no bytes: not a record
    u = h.s.tenants.state.usage["acme"]
    assert (u.appended_bytes, u.appended_records) == (8, 2)
    await h.restart(crash=True)
    u = h.s.tenants.state.usage["acme"]
    assert (u.appended_bytes, u.appended_records) == (8, 2)
    await h.s.journal.snapshot(h.s.state)
    await h.restart(crash=True)
    assert (
        h.s.tenants.state.usage["acme"].appended_bytes,
        h.s.tenants.state.usage["acme"].appended_records,
    ) == (8, 2)


@on_harness
async def test_egress_by_tier_and_requests_by_class(h: HttpHarness) -> None:
    assert (await h.http("PUT", "/v1/buckets/acme/stream/s", body=b"hot!", headers=OCTET))[0] == 201
    assert (await h.http("GET", "/v1/buckets/acme/stream/s?offset=-1"))[2] == b"hot!"
    await h.flush()  # hot copies go (hot_retention_s = 0): the next read is cold
    assert h.slice_kinds("acme", "s") == ["ColdSlice"]
    assert (await h.http("GET", "/v1/buckets/acme/stream/s?offset=-1"))[2] == b"hot!"
    assert (await h.http("POST", "/v1/buckets/acme/stream/s", body=b"more", headers=OCTET))[0] == 204
    tail = h.s.streams.lookup("acme", "s").tail
    assert (await h.http("GET", "/v1/buckets/acme/stream/s?offset=-1&live=long-poll"))[0] == 200
    assert (await h.http("HEAD", "/v1/buckets/acme/stream/s"))[0] == 200
    assert (await h.http("GET", "/v1/buckets/acme"))[0] == 200
    assert (await h.http("GET", "/v1/buckets/nope/stream/s?offset=-1"))[0] == 404  # no bucket: nobody's usage
    row = await usage(h)
    assert row["egress_bytes"] == {"hot": 4 + 4, "cold": 4 + 4}  # the long-poll read 4 cold + 4 hot
    assert row["requests"] == {"append": 2, "read": 3, "live": 1, "admin": 1}
    assert row["appended_bytes"] == tail == 8 and row["appended_records"] == 2
    assert row["streams"] == 1 and sum(row["retained_bytes"].values()) == 8
    assert "nope" not in h.s.tenants.counter._pending
    # Shown live before they are journaled; journaled by record_usage; a crash loses what was not.
    assert h.s.tenants.state.peek("acme").read_requests == 0
    assert await h.s.tenants.record_usage() >= 1
    assert h.s.tenants.state.peek("acme").read_requests == 3
    assert (await h.http("GET", "/v1/buckets/acme/stream/s?offset=-1"))[0] == 200
    await h.restart(crash=True)
    row = await usage(h)
    assert row["requests"]["read"] == 3 and row["egress_bytes"] == {"hot": 8, "cold": 8}


@on_harness
async def test_usage_survives_bucket_erasure(h: HttpHarness) -> None:
    await h.create("acme", "s", b"x" * 100)
    await h.s.tenants.record_usage()
    assert (await h.http("DELETE", "/v1/buckets/acme"))[0] == 204
    row = await usage(h)
    assert row["erased"] is True and row["appended_bytes"] == 100 and row["streams"] == 0
    await h.restart(crash=True)
    assert (await usage(h))["appended_bytes"] == 100
    status, _, body = await h.http("GET", "/metrics")
    assert samples(body.decode())['tiered_bucket_appended_bytes_total{bucket="acme"}'] == 100
    assert (await h.http("GET", "/v1/admin/usage?bucket=never"))[0] == 404


def test_metrics_label_cardinality_is_capped(tmp_path: Path) -> None:
    async def body(h: HttpHarness) -> None:
        for i, name in enumerate(["b-one", "b-two", "b-three"]):
            await h.bucket(name)
            await h.create(name, "s", b"x" * (10 * (i + 1)))  # 10, 20, 30 bytes
        status, _, text = await h.http("GET", "/metrics")
        m = samples(text.decode())
        appended = {k: v for k, v in m.items() if k.startswith("tiered_bucket_appended_bytes_total")}
        assert appended == {
            'tiered_bucket_appended_bytes_total{bucket="_other"}': 10,  # b-one, acme and default summed
            'tiered_bucket_appended_bytes_total{bucket="b-three"}': 30,
            'tiered_bucket_appended_bytes_total{bucket="b-two"}': 20,
        }
        assert m['tiered_bucket_streams{bucket="_other"}'] == 1

    on_harness(body, metrics_max_buckets=2)(tmp_path)


def test_usage_log_lines_and_rotation(tmp_path: Path) -> None:
    log_path = tmp_path / "usage" / "usage.jsonl"

    async def body(h: HttpHarness) -> None:
        await h.create("acme", "s", b"x" * 10)
        assert (await h.http("GET", "/v1/buckets/acme/stream/s?offset=-1"))[0] == 200
        await h.s.tenants.record_usage()
        lines = [json.loads(ln) for ln in log_path.read_text().splitlines()]
        assert [ln["bucket"] for ln in lines] == ["acme", "default"]  # one line per bucket
        acme = lines[0]
        durable = h.s.tenants.state.usage["acme"]
        assert acme["appended_bytes"] == durable.appended_bytes == 10
        assert acme["requests"]["read"] == durable.read_requests == 1
        assert (
            acme["retained_bytes"] == {"hot": 10, "cold": 0, "producers": 0, "snapshots": 0, "key_index": 0}
            and acme["streams"] == 1
        )
        assert acme["ts_ms"] == h.clock.ms and acme["from_ms"] <= acme["ts_ms"]
        # Size: each interval's lines exceed 300 bytes, so every write after the first rotates.
        await h.s.tenants.record_usage()
        rotated = sorted(p.name for p in log_path.parent.iterdir() if p.name != "usage.jsonl")
        assert len(rotated) == 1 and rotated[0].startswith("usage.jsonl.")
        assert len(log_path.read_text().splitlines()) == 2

    on_harness(body, usage_log=str(log_path), usage_log_max_bytes=300)(tmp_path)


def test_usage_log_rotates_by_age(tmp_path: Path) -> None:
    log_path = tmp_path / "usage.jsonl"

    async def body(h: HttpHarness) -> None:
        await h.s.tenants.record_usage()
        await h.s.tenants.record_usage()
        assert len(list(tmp_path.glob("usage.jsonl.*"))) == 0
        h.clock.advance(3_600_000)
        await h.s.tenants.record_usage()
        assert len(list(tmp_path.glob("usage.jsonl.*"))) == 1
        assert len(log_path.read_text().splitlines()) == 2

    on_harness(body, usage_log=str(log_path), usage_log_rotate_s=3600.0)(tmp_path)


@on_harness
async def test_token_secrets_never_reach_the_journal_or_snapshots(h: HttpHarness) -> None:
    status, _, body = await h.http("POST", "/v1/admin/tokens", json_body={"bucket": "acme", "scope": "write"})
    assert status == 201
    issued = json.loads(body)
    status, _, body = await h.http("POST", f"/v1/admin/tokens/{issued['id']}/rotate")
    rotated = json.loads(body)
    await h.s.journal.snapshot(h.s.state)
    data = h.config.data_path
    stored = b"".join(p.read_bytes() for p in [*data.glob("hot/*"), *data.glob("snapshots/*")] if p.is_file())
    from tiered.engine.auth.token_format import digest, split

    for token in (issued["token"], rotated["token"]):
        token_id, secret = split(token)  # type: ignore[misc]
        assert token.encode() not in stored and secret.encode() not in stored
        assert token_id.encode() in stored and digest(secret) in stored  # only the id and the hash
    listing = (await h.http("GET", "/v1/admin/tokens"))[2]
    assert issued["token"].encode() not in listing and b"sha256" not in listing


# --------------------------------------------------------------------------- SIGKILL with retrying producers


def test_usage_after_sigkill_equals_the_acknowledged_work(tmp_path: Path) -> None:
    srv = AuthServer(tmp_path / "data", "--snapshot-every-bytes", "65536", mode="tokens").start()
    try:
        srv.bucket("acme")
        token = bearer(srv.token("acme", "write")["token"])
        producers, appends = 4, 100
        for p in range(producers):
            status, _, body = request(
                "PUT", f"{srv.url}/v1/buckets/acme/stream/p{p}", {**token, **OCTET}, b""
            )
            assert status == 201, body
        acked = [0] * producers
        acked_bytes = [0] * producers
        errors: list[str] = []
        stop = threading.Event()

        def produce(p: int) -> None:
            rng = random.Random(p)
            url = f"{srv.url}/v1/buckets/acme/stream/p{p}"
            for seq in range(appends):
                body = rng.randbytes(rng.randint(1, 3000))
                headers = {
                    **token,
                    **OCTET,
                    "Producer-Id": f"p{p}",
                    "Producer-Epoch": "0",
                    "Producer-Seq": str(seq),
                }
                deadline = time.monotonic() + scaled(60)
                while True:  # retry the same (producer, epoch, seq) until it is acknowledged
                    if time.monotonic() > deadline or stop.is_set():
                        errors.append(f"p{p} seq {seq}: never acknowledged")
                        return
                    try:
                        status, _, resp = request("POST", url, headers, body, timeout=5)
                    except OSError:
                        time.sleep(0.05)
                        continue
                    if status in (200, 204):
                        break
                    if status == 503:
                        time.sleep(0.05)
                        continue
                    errors.append(f"p{p} seq {seq}: {status} {resp[:200]!r}")
                    return
                acked[p] += 1
                acked_bytes[p] += len(body)

        threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
        for t in threads:
            t.start()
        try:
            for _ in range(3):  # kill it while appends are in flight, restart on the same data dir
                target = sum(acked) + producers * appends // 5
                deadline = time.monotonic() + scaled(30)
                while sum(acked) < target and time.monotonic() < deadline and not errors:
                    time.sleep(0.01)
                srv.kill()
                time.sleep(0.1)
                srv.start()
        finally:
            for t in threads:
                t.join(120)
            stop.set()
        assert not errors, errors
        assert acked == [appends] * producers

        def check() -> None:
            status, body = srv.admin("GET", "/v1/admin/usage?bucket=acme")
            assert status == 200
            [row] = body["buckets"]
            assert row["appended_records"] == sum(acked)
            assert row["appended_bytes"] == sum(acked_bytes)
            for p in range(producers):
                status, headers, _ = request("HEAD", f"{srv.url}/v1/buckets/acme/stream/p{p}", OPERATOR)
                assert int(headers["Stream-Next-Offset"].replace("_", "")) == acked_bytes[p]

        check()
        srv.kill()  # and once more from the journal alone (snapshot + replay)
        srv.start()
        check()
    finally:
        srv.stop()
