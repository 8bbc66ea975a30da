"""Per-bucket quotas: exact boundaries, the statuses and bodies of refusals, and that a refusal writes nothing.

Rates run on a ``VirtualClock`` (token buckets count whole milliseconds of
its wall time), so every boundary is exact: the request that reaches a limit
passes, the next is refused, and one more millisecond's worth of tokens lets
exactly one more through. After every refusal the state's fingerprint is what
it was before.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.gc_support import HttpHarness, VirtualClock, make_config
from tests.support.state_fingerprint import fingerprint
from tiered.core.clock import VirtualClock as Clock
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.tenants import quotas as q
from tiered.engine.tenants.quotas import Quotas
from tiered.engine.tenants.ratelimit import TokenBucket, retry_after_s

pytestmark = pytest.mark.timeout(120)
OCTET = {"Content-Type": "application/octet-stream"}


# --------------------------------------------------------------------------- pure parts


def test_token_bucket_boundaries_are_exact() -> None:
    clock = Clock()
    tb = TokenBucket(5, clock.ms)
    for _ in range(5):
        assert tb.wait_ms(1, clock.ms) == 0
        tb.take(1, clock.ms)
    assert tb.wait_ms(1, clock.ms) == 200
    clock.advance(199)
    assert tb.wait_ms(1, clock.ms) == 1
    clock.advance(1)
    assert tb.wait_ms(1, clock.ms) == 0
    tb.take(1, clock.ms)
    clock.advance(10_000)  # never more than a full bucket
    for _ in range(5):
        tb.take(1, clock.ms)
    assert tb.wait_ms(1, clock.ms) == 200


def test_a_cost_larger_than_the_bucket_passes_when_full_and_leaves_a_debt() -> None:
    clock = Clock()
    tb = TokenBucket(100, clock.ms)
    assert tb.wait_ms(500, clock.ms) == 0  # full: passes
    tb.take(500, clock.ms)
    assert tb.wait_ms(1, clock.ms) == 4_010  # 400 tokens of debt, then 1
    assert retry_after_s(4_010) == 5
    clock.advance(4_010)
    assert tb.wait_ms(1, clock.ms) == 0
    assert tb.wait_ms(500, clock.ms) == 990  # needs the bucket full again (99 more tokens)


def test_zero_rate_refuses_everything_and_a_clock_stepping_back_refills_nothing() -> None:
    tb = TokenBucket(0, 1_000)
    assert tb.wait_ms(1, 1_000) == -1 and retry_after_s(-1) == 3600
    tb = TokenBucket(10, 5_000)
    tb.take(10, 5_000)
    assert tb.wait_ms(1, 4_000) == 100  # no refill from a clock that went back
    assert tb.wait_ms(1, 5_100) == 0


def test_size_checks_and_effective_quotas() -> None:
    quotas = Quotas(max_streams=2, max_retained_bytes=100, max_body_bytes=10)
    q.check_streams(quotas, 1, 1)
    q.check_streams(quotas, 2, 0)  # replacing an expired stream adds none
    q.check_retained(quotas, 60, 40)
    q.check_body(quotas, 10)
    for call, code in (
        (lambda: q.check_streams(quotas, 2, 1), ErrorCode.QUOTA_EXCEEDED),
        (lambda: q.check_retained(quotas, 100, 1), ErrorCode.QUOTA_EXCEEDED),
        (lambda: q.check_body(quotas, 11), ErrorCode.PAYLOAD_TOO_LARGE),
    ):
        with pytest.raises(TieredError) as err:
            call()
        assert err.value.code is code and err.value.context["limit"] in (2, 100, 10)
    defaults = q.from_config({"max_streams": 5, "max_body_bytes": 0})
    assert defaults == Quotas(max_streams=5)
    assert q.effective(defaults, {"max_streams": None, "append_requests_per_s": 7}) == Quotas(
        append_requests_per_s=7
    )
    with pytest.raises(TieredError):
        q.validate_overrides({"max_stream": 1})
    with pytest.raises(TieredError):
        q.validate_overrides({"max_streams": True})  # type: ignore[dict-item]
    with pytest.raises(TieredError):
        q.validate_overrides({"max_streams": -1})


# --------------------------------------------------------------------------- over HTTP, on a virtual clock


def on_harness(body: Callable[[HttpHarness], Awaitable[None]]) -> Callable[[Path], None]:
    """A test running ``body`` against a fresh in-process server with bucket ``acme``."""

    def test(tmp_path: Path) -> None:
        async def main() -> None:
            harness = HttpHarness(
                make_config(tmp_path / "data", long_poll_timeout_s=1.0), clock=VirtualClock()
            )
            await harness.start()
            try:
                await harness.bucket("acme")
                await body(harness)
            finally:
                await harness.stop()

        asyncio.run(main())

    test.__name__ = body.__name__
    test.__doc__ = body.__doc__
    return test


async def quota(h: HttpHarness, **limits: Any) -> dict[str, Any]:
    status, _, body = await h.http("PUT", "/v1/admin/quotas/acme", json_body=limits)
    assert status == 200, body
    return json.loads(body)


def url(path: str) -> str:
    return "/v1/buckets/acme/stream/" + path


async def refused(
    h: HttpHarness, call: Callable[[], Awaitable[tuple[int, Any, bytes]]], status: int, quota_name: str
) -> Any:
    """The call is refused with ``status`` naming ``quota_name``, and the state did not change."""
    before = fingerprint(h.s.state)
    got, headers, body = await call()
    assert got == status, body
    error = json.loads(body)["error"]
    assert error["quota"] == quota_name and isinstance(error["limit"], int)
    assert fingerprint(h.s.state) == before
    return headers


@on_harness
async def test_append_requests_per_second(h: HttpHarness) -> None:
    await h.create("acme", "s")
    await quota(h, append_requests_per_s=3)
    for i in range(3):
        assert (await h.http("POST", url("s"), body=b"x", headers=OCTET))[0] == 204, i
    headers = await refused(
        h, lambda: h.http("POST", url("s"), body=b"x", headers=OCTET), 429, "append_requests_per_s"
    )
    assert headers["Retry-After"] == "1"
    h.clock.advance(333)  # 0.999 of a token
    await refused(h, lambda: h.http("POST", url("s"), body=b"x", headers=OCTET), 429, "append_requests_per_s")
    h.clock.advance(1)
    assert (await h.http("POST", url("s"), body=b"x", headers=OCTET))[0] == 204
    assert h.s.streams.lookup("acme", "s").tail == 4
    # Other buckets are not limited by acme's quota.
    await h.create("default", "free")
    for _ in range(10):
        assert (await h.http("POST", "/v1/stream/free", body=b"x", headers=OCTET))[0] == 204


@on_harness
async def test_append_bytes_per_second(h: HttpHarness) -> None:
    await h.create("acme", "s")
    await quota(h, append_bytes_per_s=100)
    assert (await h.http("POST", url("s"), body=b"a" * 60, headers=OCTET))[0] == 204
    assert (await h.http("POST", url("s"), body=b"b" * 40, headers=OCTET))[0] == 204
    await refused(h, lambda: h.http("POST", url("s"), body=b"c", headers=OCTET), 429, "append_bytes_per_s")
    h.clock.advance(10)  # one byte's worth
    assert (await h.http("POST", url("s"), body=b"c", headers=OCTET))[0] == 204
    await refused(h, lambda: h.http("POST", url("s"), body=b"d", headers=OCTET), 429, "append_bytes_per_s")
    # A create with a body counts its bytes too.
    headers = await refused(
        h, lambda: h.http("PUT", url("t"), body=b"e", headers=OCTET), 429, "append_bytes_per_s"
    )
    assert int(headers["Retry-After"]) >= 1
    assert await h.read("acme", "s") == b"a" * 60 + b"b" * 40 + b"c"


@on_harness
async def test_max_retained_bytes_counts_hot_and_cold(h: HttpHarness) -> None:
    await quota(h, max_retained_bytes=100)
    assert (await h.http("PUT", url("s"), body=b"a" * 30, headers=OCTET))[0] == 201
    await h.flush()  # now cold: still counted
    assert h.s.streams.lookup("acme", "s").cold_refs
    assert (await h.http("POST", url("s"), body=b"b" * 70, headers=OCTET))[0] == 204  # reaches 100
    await refused(h, lambda: h.http("POST", url("s"), body=b"c", headers=OCTET), 507, "max_retained_bytes")
    await refused(h, lambda: h.http("PUT", url("t"), body=b"c", headers=OCTET), 507, "max_retained_bytes")
    assert (await h.http("PUT", url("t"), headers=OCTET))[0] == 201  # an empty stream holds nothing
    assert (await h.http("DELETE", url("s")))[0] == 204  # releasing data makes room
    assert (await h.http("POST", url("t"), body=b"d" * 100, headers=OCTET))[0] == 204
    await refused(h, lambda: h.http("POST", url("t"), body=b"e", headers=OCTET), 507, "max_retained_bytes")


@on_harness
async def test_max_streams(h: HttpHarness) -> None:
    await quota(h, max_streams=2)
    assert (await h.http("PUT", url("a"), headers=OCTET))[0] == 201
    assert (await h.http("PUT", url("b"), headers=OCTET))[0] == 201
    assert (await h.http("PUT", url("b"), headers=OCTET))[0] == 200  # idempotent: no new stream
    await refused(h, lambda: h.http("PUT", url("c"), headers=OCTET), 507, "max_streams")
    fork = {"Stream-Forked-From": url("a")}
    await refused(h, lambda: h.http("PUT", url("f"), headers=fork), 507, "max_streams")
    assert (await h.http("DELETE", url("a")))[0] == 204
    assert (await h.http("PUT", url("c"), headers=OCTET))[0] == 201
    # A stream whose TTL ran out is replaced in place: the count does not grow.
    assert (await h.http("DELETE", url("c")))[0] == 204
    assert (await h.http("PUT", url("ttl"), headers={**OCTET, "Stream-TTL": "1"}))[0] == 201
    h.clock.advance(1_000)
    assert (await h.http("PUT", url("ttl"), headers=OCTET))[0] == 201


@on_harness
async def test_max_body_bytes(h: HttpHarness) -> None:
    await h.create("acme", "s")
    await quota(h, max_body_bytes=10)
    assert (await h.http("POST", url("s"), body=b"x" * 10, headers=OCTET))[0] == 204
    await refused(h, lambda: h.http("POST", url("s"), body=b"x" * 11, headers=OCTET), 413, "max_body_bytes")
    await refused(h, lambda: h.http("PUT", url("t"), body=b"x" * 11, headers=OCTET), 413, "max_body_bytes")


@on_harness
async def test_max_live_readers(h: HttpHarness) -> None:
    await h.create("acme", "s")
    await quota(h, max_live_readers=1)
    live = url("s") + "?offset=now&live=long-poll"
    first = asyncio.create_task(h.http("GET", live))
    for _ in range(200):
        if h.s.gate.live.get("acme"):
            break
        await asyncio.sleep(0.01)
    headers = await refused(h, lambda: h.http("GET", live), 429, "max_live_readers")
    assert headers["Retry-After"] == "1"
    assert (await h.http("GET", url("s") + "?offset=-1"))[0] == 200  # catch-up reads are not live
    assert (await first)[0] == 204
    assert h.s.gate.live == {}
    assert (await h.http("GET", live))[0] == 204


def test_config_defaults_and_overrides(tmp_path: Path) -> None:
    asyncio.run(_config_defaults_and_overrides(tmp_path))


async def _config_defaults_and_overrides(tmp_path: Path) -> None:
    h = HttpHarness(make_config(tmp_path / "data", quota_max_streams=1), clock=VirtualClock())
    await h.start()
    try:
        await h.bucket("acme")
        status, _, body = await h.http("GET", "/v1/admin/quotas/acme")
        assert status == 200 and json.loads(body)["effective"]["max_streams"] == 1
        assert (await h.http("PUT", url("a"), headers=OCTET))[0] == 201
        assert (await h.http("PUT", url("b"), headers=OCTET))[0] == 507
        view = await quota(h, max_streams=None)  # this bucket: unlimited
        assert view["overrides"] == {"max_streams": None} and view["effective"]["max_streams"] is None
        assert (await h.http("PUT", url("b"), headers=OCTET))[0] == 201
        await h.restart(crash=True)  # overrides are journal state
        assert h.s.gate.quotas("acme").max_streams is None
        assert h.s.gate.quotas("default").max_streams == 1
        await quota(h)  # empty: back to the defaults
        assert h.s.gate.quotas("acme").max_streams == 1
        for body_, code in (
            ({"max_streamz": 1}, 400),
            ({"max_streams": "1"}, 400),
            ({"max_streams": -1}, 400),
            ([1], 400),
        ):
            assert (await h.http("PUT", "/v1/admin/quotas/acme", json_body=body_))[0] == code
        assert (await h.http("PUT", "/v1/admin/quotas/nope", json_body={}))[0] == 404
        assert (await h.http("GET", "/v1/admin/quotas/nope"))[0] == 404
    finally:
        await h.stop()
