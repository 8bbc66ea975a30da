"""The append route's fused path (``tiered.api.append_path``) answers exactly as the general chain does.

Two engines, prepared identically (same virtual clock, same history), one served by the handler with
the fused path and one by the general chain alone (``build_handler(engine, fused=False)``). The same
requests go through both: appends that succeed, producers (new data, duplicates, stale epochs, gaps),
closes, content types, ``Stream-Seq``, conditional appends, bad headers and paths, a stream or bucket
that does not exist, every auth refusal (no credential, a bad one, no grant, too low a scope), a
client that leaves mid-body and a bug in the body read. Each answer's status, headers (request ids
aside when the server made them up) and body must be identical, and so must the request metrics, the
buckets' usage and the streams' state at the end.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from multidict import CIMultiDict

from tests.support.gc_support import T0, make_config
from tiered.api.app import build_handler
from tiered.api.append_path import AppendPath, append_rows
from tiered.api.kit.errors import ClientDisconnected
from tiered.api.kit.middleware.request_id import HEADER
from tiered.api.kit.types import Handler, Request, Response
from tiered.api.table import ROUTES, Kind, RouteSpec, Scope
from tiered.core.clock import VirtualClock
from tiered.engine.engine import Engine

pytestmark = pytest.mark.timeout(120)

ADMIN = "fused-path-admin-token-0123456789"
OCTET = "application/octet-stream"
JSON = "application/json"

Body = bytes | Callable[[], Awaitable[bytes]]


@dataclass
class Call:
    """One request of the scenario; ``token`` names a credential issued in ``setup`` (``admin``: the operator)."""

    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    body: Body = b""
    token: str | None = "admin"
    query: str = ""


async def _left() -> bytes:
    raise ClientDisconnected("the client left after 3 of the body's 10 bytes")


async def _bug() -> bytes:
    raise RuntimeError("a bug in the body read")


def _append(path: str, body: bytes = b"x", content_type: str | None = OCTET, **headers: str) -> Call:
    h = {k.replace("_", "-"): v for k, v in headers.items()}
    if content_type is not None:
        h["Content-Type"] = content_type
    h.setdefault("X-Request-Id", "req-" + re.sub(r"[^A-Za-z0-9]", "-", path.rsplit("/", 1)[-1]))
    return Call("POST", path, h, body)


SETUP = [
    Call("PUT", "/v1/stream/s", {"Content-Type": OCTET}),
    Call("PUT", "/v1/stream/j", {"Content-Type": JSON}),
    Call("PUT", "/v1/stream/closing", {"Content-Type": OCTET}),
    Call("PUT", "/v1/buckets/bkt2", {}, b""),
    Call("PUT", "/v1/buckets/bkt2/stream/t", {"Content-Type": "text/plain"}),
]
# Tokens: (bucket, scope, prefix): issued in both engines, in this order.
TOKENS = {
    "writer": ("default", "write", None),
    "reader": ("default", "read", None),
    "other": ("bkt2", "write", None),
    "prefixed": ("default", "write", "p/"),
}

SCENARIO = [
    _append("/v1/stream/s", b"hello"),
    _append("/v1/stream/s", b"world", **{"Stream_Seq": "0001"}),
    _append("/v1/stream/s", b"again", **{"Stream_Seq": "0001"}),  # regression: 409
    _append("/v1/stream/s", b"x", **{"Stream_Seq": ""}),  # empty: 400
    _append("/v1/stream/s", b"p0", Producer_Id="w", Producer_Epoch="0", Producer_Seq="0"),  # 200
    _append("/v1/stream/s", b"p0", Producer_Id="w", Producer_Epoch="0", Producer_Seq="0"),  # duplicate 204
    _append("/v1/stream/s", b"p2", Producer_Id="w", Producer_Epoch="0", Producer_Seq="2"),  # gap 409
    _append("/v1/stream/s", b"p1", Producer_Id="w", Producer_Epoch="1", Producer_Seq="0"),  # new epoch
    _append("/v1/stream/s", b"p1", Producer_Id="w", Producer_Epoch="0", Producer_Seq="1"),  # stale 403
    _append("/v1/stream/s", b"p", Producer_Id="w", Producer_Epoch="1"),  # incomplete: 400
    _append("/v1/stream/s", b"x", content_type="text/plain"),  # mismatch 409
    _append("/v1/stream/s", b"x", content_type=None),  # no type: 400
    _append("/v1/stream/s", b"x", content_type="not a type"),  # 400
    _append("/v1/stream/s", b""),  # no body: 400
    _append("/v1/stream/s", b"x", Producer_Id="p" * 300, Producer_Epoch="0", Producer_Seq="0"),  # too long
    _append("/v1/stream/s", b"x", Stream_Seq="bad\x01value"),  # not printable: 400
    _append("/v1/stream/s", b"cond", Stream_Expected_Offset="0000000000000000_0000000000000000"),  # 412
    _append("/v1/stream/s", b"cond", Stream_Record_Match="0"),  # record match: 412
    _append("/v1/stream/s", b"cond", Stream_Expected_Offset="nonsense"),  # 400
    _append("/v1/stream/j", b'{"a": 1}'),
    _append("/v1/stream/j", b'[{"a": 2}, {"b": 3}]'),
    _append("/v1/stream/j", b"[]"),  # an empty array appends nothing: 400
    _append("/v1/stream/j", b"{not json"),
    _append("/v1/stream/closing", b"last", Stream_Closed="true"),
    _append("/v1/stream/closing", b"more"),  # closed: 409 with Stream-Closed
    _append("/v1/stream/closing", b"", Stream_Closed="true"),  # close again: 204
    _append("/v1/stream/missing", b"x"),  # 404
    _append("/v1/buckets/bkt2/stream/t", b"text", content_type="text/plain"),
    _append("/v1/buckets/nope/stream/t", b"x"),  # no such bucket
    _append("/v1/stream/s%zz", b"x"),  # a stray '%': 400 (the general path answers)
    _append("/v1/stream/__ds/nothing", b"x"),  # the control namespace: not an append row
    _append("/v1/buckets/B@D/stream/t", b"x"),  # a bad bucket name: 400
    Call("POST", "/v1/stream/s", {"Content-Type": OCTET}, b"no id"),  # a generated request id
    Call("POST", "/v1/stream/s", {"Content-Type": OCTET, "X-Request-Id": "bad id!"}, b"bad id"),
    Call("POST", "/v1/stream/s", {"Content-Type": OCTET, "X-Request-Id": "gone"}, _left),
    Call("POST", "/v1/stream/s", {"Content-Type": OCTET, "X-Request-Id": "bug"}, _bug),
    Call("GET", "/v1/stream/s", {"X-Request-Id": "a-read"}, query="offset=-1"),
    Call("OPTIONS", "/v1/stream/s", {"X-Request-Id": "preflight"}),
    Call("DELETE", "/v1/stream/missing", {"X-Request-Id": "delete"}),
]
# With auth on: every refusal the scope check makes, before and after a good append.
AUTH_SCENARIO = [
    Call("POST", "/v1/stream/s", {"Content-Type": OCTET, "X-Request-Id": "w"}, b"by writer", "writer"),
    Call("POST", "/v1/stream/s", {"Content-Type": OCTET, "X-Request-Id": "n"}, b"nobody", None),  # 401
    Call("POST", "/v1/stream/s", {"Content-Type": OCTET, "X-Request-Id": "bad"}, b"x", "forged"),  # 401
    Call("POST", "/v1/stream/s", {"Content-Type": OCTET, "X-Request-Id": "r"}, b"x", "reader"),  # 403
    Call("POST", "/v1/stream/s", {"Content-Type": OCTET, "X-Request-Id": "o"}, b"x", "other"),  # 404
    Call("POST", "/v1/stream/missing", {"Content-Type": OCTET, "X-Request-Id": "om"}, b"x", "other"),  # 404
    Call("POST", "/v1/stream/s", {"Content-Type": OCTET, "X-Request-Id": "pf"}, b"x", "prefixed"),  # 404
    Call(
        "POST",
        "/v1/buckets/bkt2/stream/t",
        {"Content-Type": "text/plain", "X-Request-Id": "o2"},
        b"y",
        "other",
    ),
    Call(
        "POST",
        "/v1/buckets/bkt2/stream/t",
        {"Content-Type": "text/plain", "X-Request-Id": "w2"},
        b"y",
        "writer",
    ),
    Call(
        "POST",
        "/v1/stream/s",
        {"Content-Type": OCTET, "Authorization": "Basic abc", "X-Request-Id": "basic"},
        b"x",
        None,
    ),
    Call("POST", "/v1/stream/s", {"Content-Type": OCTET, "X-Request-Id": "big"}, b"z" * 100, "writer"),
]


@dataclass
class Side:
    """One engine and its handler, with the credentials issued on it."""

    engine: Engine
    handler: Handler
    tokens: dict[str, str]


async def _send(side: Side, call: Call) -> Response:
    headers: CIMultiDict[str] = CIMultiDict(call.headers)
    if call.token == "admin":
        headers["Authorization"] = f"Bearer {ADMIN}"
    elif call.token == "forged":
        headers["Authorization"] = "Bearer tdt_forged_0000000000000000"
    elif call.token is not None:
        headers["Authorization"] = f"Bearer {side.tokens[call.token]}"
    body = call.body
    if isinstance(body, bytes):
        data = body

        async def read() -> bytes:
            return data

        headers.setdefault("Content-Length", str(len(data)))
        reader: Callable[[], Awaitable[bytes]] = read
    else:
        reader = body
    request = Request(call.method, call.path, call.query, headers, reader, host="127.0.0.1:1")
    return await side.handler(request)


async def _answer(side: Side, call: Call) -> tuple[Any, ...]:
    """What the client saw: (status, headers, body), or the exception the adapter got."""
    try:
        response = await _send(side, call)
    except ClientDisconnected as exc:
        return ("disconnect", str(exc))
    headers = dict(response.headers)
    if call.headers.get("X-Request-Id") in (None, "bad id!"):  # made up by the server: its shape only
        rid = headers.pop(HEADER)
        assert rid and rid != "bad id!"
    assert isinstance(response.body, bytes)
    return response.status, list(headers.items()), response.body


async def _start(tmp: Path, auth: str, fused: bool) -> Side:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "admin").write_text(ADMIN)
    config = make_config(tmp / "data", auth=auth, admin_token_file=str(tmp / "admin"))
    engine = Engine(config, VirtualClock(T0))
    await engine.start(jobs=False)
    handler = build_handler(engine, fused=fused)
    assert isinstance(handler, AppendPath) == fused
    side = Side(engine, handler, {})
    for call in SETUP:
        response = await _send(side, call)
        assert response.status in (200, 201), (call, response.status, response.body)
    if auth != "none":
        for name, (bucket, scope, prefix) in TOKENS.items():
            body = json.dumps({"bucket": bucket, "scope": scope, "prefix": prefix, "name": name}).encode()
            response = await _send(side, Call("POST", "/v1/admin/tokens", {"Content-Type": JSON}, body))
            assert response.status == 201, response.body
            assert isinstance(response.body, bytes)
            side.tokens[name] = json.loads(response.body)["token"]
    return side


def _requests_metrics(exposition: bytes) -> list[str]:
    return sorted(
        line
        for line in exposition.decode().splitlines()
        if line.startswith(("tiered_http_requests_total", "tiered_http_client_disconnects_total"))
    )


async def _observed(side: Side) -> tuple[Any, ...]:
    """What the two engines must agree on after the scenario: metrics, usage, the streams."""
    metrics = await _send(side, Call("GET", "/metrics", {"X-Request-Id": "metrics"}))
    assert isinstance(metrics.body, bytes)
    state = side.engine.state
    streams = sorted(
        (s.bucket, s.path, s.tail, s.closed, s.stream_seq, sorted(s.producers))
        for s in state.streams.values()
    )
    usage = {b: side.engine.tenants.counter.pending(b) for b in ("default", "bkt2")}
    return _requests_metrics(metrics.body), usage, streams


@pytest.fixture(params=["none", "tokens"])
def auth(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_the_fused_path_answers_as_the_general_chain(
    tmp_path: Path, auth: str, caplog: pytest.LogCaptureFixture
) -> None:
    calls = SCENARIO + (AUTH_SCENARIO if auth != "none" else [])

    async def scenario() -> None:
        fused = await _start(tmp_path / "fused", auth, fused=True)
        general = await _start(tmp_path / "general", auth, fused=False)
        try:
            statuses = []
            for call in calls:
                with caplog.at_level(logging.ERROR, logger="tiered.api.kit.errors"):
                    caplog.clear()
                    got = await _answer(fused, call)
                    fused_log = [r.getMessage() for r in caplog.records]
                    caplog.clear()
                    want = await _answer(general, call)
                    general_log = [r.getMessage() for r in caplog.records]
                assert got == want, call
                assert fused_log == general_log, call
                statuses.append(got[0])
            # The scenario reaches what it means to: successes, every kind of refusal, a client gone, a bug.
            assert {200, 204, 400, 403, 404, 409, 412, 500, "disconnect"} <= set(statuses)
            if auth != "none":
                assert 401 in statuses
            assert await _observed(fused) == await _observed(general)
        finally:
            await fused.engine.stop()
            await general.engine.stop()

    asyncio.run(scenario())


def test_a_cancelled_append_counts_as_a_client_that_left(tmp_path: Path) -> None:
    """The adapter cancels a request whose client left: counted as a disconnect on both paths, never answered."""

    async def scenario() -> None:
        sides = [await _start(tmp_path / name, "none", fused) for name, fused in (("f", True), ("g", False))]
        try:
            for side in sides:
                started = asyncio.Event()

                async def slow(started: asyncio.Event = started) -> bytes:
                    started.set()
                    await asyncio.sleep(60)
                    return b"never"

                task = asyncio.ensure_future(
                    _send(side, Call("POST", "/v1/stream/s", {"Content-Type": OCTET}, slow))
                )
                await asyncio.wait_for(started.wait(), 10)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            observed = [await _observed(side) for side in sides]
            assert observed[0] == observed[1]
            assert any(
                'tiered_http_client_disconnects_total{phase="request",route="append"} 1.0' in line
                for line in observed[0][0]
            )
        finally:
            for side in sides:
                await side.engine.stop()

    asyncio.run(scenario())


def test_append_rows_are_the_tables_and_a_row_it_cannot_serve_fails_at_start_up() -> None:
    rows = append_rows()
    assert {spec.pattern for spec in rows} == {
        "/v1/stream/{path...}",
        "/v1/buckets/{bucket}/stream/{path...}",
    }
    assert all(spec.methods == ("POST",) and spec.label == "append" for spec in rows)
    spec = next(iter(rows))
    for scope in (Scope(Kind.BODY), Scope(Kind.OPEN)):
        changed = RouteSpec(
            spec.family, spec.methods, spec.pattern, spec.handler, scope, spec.usage, spec.shard, spec.fanout,
            spec.scatter, spec.label,
        )  # fmt: skip
        others: Iterator[RouteSpec] = (r for r in ROUTES if r is not spec)
        with pytest.raises(AssertionError, match="cannot serve"):
            append_rows((*others, changed))
