"""The token routes of a cluster node, in process: shards stood in for by token tables (``ClusterTokens``).

What each shard is sent, in which order, and what the client gets when a
shard refuses or cannot be reached: the secret only when every shard has the
token, the id revoked everywhere otherwise (503), a failed rotation leaving
the old token on the token shard.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
import pytest

from tiered.api.kit.middleware.admin_auth import AdminGuard
from tiered.api.kit.types import Request, Response, json_response
from tiered.api.routes.auth import InstallBody
from tiered.cluster.features.token_install import ClusterTokens
from tiered.cluster.gateway.forward import ForwardFailed
from tiered.cluster.membership.shards import shard_of
from tiered.core.clock import VirtualClock
from tiered.core.errors import ErrorCode, TieredError
from tiered.engine.auth.token_format import split

SHARDS = 4
BUCKET = "acme"
HOME = shard_of(BUCKET, "", SHARDS)
TOKEN_SHARD = shard_of("default", "", SHARDS)


class Shards:
    """Four shards' token tables; ``down``: shards whose owner cannot be reached; ``sent``: every sub-request."""

    clock = VirtualClock()

    def __init__(self) -> None:
        self.tables: list[dict[str, dict[str, Any]]] = [{} for _ in range(SHARDS)]
        self.down: set[int] = set()
        self.refuse: set[int] = set()
        self.sent: list[tuple[int, str, str, bool]] = []

    def shard_of(self, bucket: str, name: str) -> int:
        return shard_of(bucket, name, SHARDS)

    def shard_count(self) -> int:
        return SHARDS

    def sub(self, request: Request, shard: int, method: str, path: str, body: bytes, signed: bool) -> Request:
        async def read() -> bytes:
            return body

        headers = {"tiered-shard": str(shard), **({"signed": "1"} if signed else {})}
        return Request(method, path, "", headers, read)

    async def send(self, request: Request, shard: int) -> Response:
        signed = request.headers.get("signed") == "1"
        self.sent.append((shard, request.method, request.path, signed))
        if shard in self.down:
            raise ForwardFailed(shard, "unreachable", sent=True)
        table = self.tables[shard]
        token_id = request.path.rsplit("/", 1)[-1]
        if request.method == "PUT":
            assert signed
            if shard in self.refuse:
                return json_response({"error": {"code": "BUCKET_NOT_FOUND"}}, 404)
            body = msgspec.json.decode(await request.body(), type=InstallBody)
            record = body.record(token_id)
            if record.replaces is not None and record.replaced_until_ms is not None:
                old = table.get(record.replaces)
                if old is not None:
                    old["expires_ms"] = record.replaced_until_ms
            table[token_id] = {"id": token_id, "bucket": record.bucket, "scope": record.scope, "prefix": None,
                               "name": None, "created_ms": record.created_ms, "expires_ms": record.expires_ms,
                               "expired": False}  # fmt: skip
            return json_response(table[token_id], 201)
        if request.method == "DELETE":
            if table.pop(token_id, None) is None:
                return json_response({"error": {"code": "TOKEN_NOT_FOUND"}}, 404)
            return Response(204)
        if token_id in table:
            return json_response(table[token_id])
        return json_response({"error": {"code": "TOKEN_NOT_FOUND"}}, 404)


def routes(shards: Shards) -> ClusterTokens:
    return ClusterTokens(shards, lambda: AdminGuard(None, open_without_token=True), shards.sub, shards.send)


def client(method: str, path: str, body: Any = None) -> Request:
    data = json.dumps(body).encode() if body is not None else b""

    async def read() -> bytes:
        return data

    return Request(method, path, "", {}, read)


def run(shards: Shards, method: str, path: str, body: Any = None) -> Response:
    return asyncio.run(routes(shards).serve(client(method, path, body), path))


def body_of(response: Response) -> Any:
    assert isinstance(response.body, bytes)
    return json.loads(response.body)


def test_an_issue_installs_on_the_home_shard_first_then_everywhere() -> None:
    shards = Shards()
    answer = run(shards, "POST", "/v1/admin/tokens", {"bucket": BUCKET, "scope": "write"})
    assert answer.status == 201 and answer.headers.get("Cache-Control") == "no-store"
    view = body_of(answer)
    parts = split(view["token"])
    assert parts is not None and parts[0] == view["id"]
    assert shards.sent[0] == (HOME, "PUT", f"/v1/admin/tokens/{view['id']}", True)
    assert sorted(s for s, *_ in shards.sent) == list(range(SHARDS))
    assert all(view["id"] in table for table in shards.tables)


def test_a_refusal_of_the_home_shard_is_the_answer_and_nothing_else_is_sent() -> None:
    shards = Shards()
    shards.refuse.add(HOME)
    answer = run(shards, "POST", "/v1/admin/tokens", {"bucket": BUCKET, "scope": "write"})
    assert answer.status == 404 and b"tdt_" not in bytes(answer.body)  # type: ignore[arg-type]
    assert [s for s, *_ in shards.sent] == [HOME]


@pytest.mark.parametrize("fault", ["down", "refuse"])
def test_any_other_shard_failing_revokes_the_id_everywhere(fault: str) -> None:
    shards = Shards()
    other = (HOME + 1) % SHARDS
    getattr(shards, fault).add(other)
    with pytest.raises(TieredError) as info:
        run(shards, "POST", "/v1/admin/tokens", {"bucket": BUCKET, "scope": "write"})
    assert info.value.code is ErrorCode.UNAVAILABLE and info.value.context["retry_after_s"] == 1
    assert all(table == {} for table in shards.tables)
    revoked = sorted(s for s, method, *_ in shards.sent if method == "DELETE")
    assert revoked == list(range(SHARDS))


def test_a_lost_answer_from_the_home_shard_is_rolled_back_too() -> None:
    shards = Shards()
    shards.down.add(HOME)
    with pytest.raises(TieredError) as info:
        run(shards, "POST", "/v1/admin/tokens", {"bucket": BUCKET, "scope": "write"})
    assert info.value.code is ErrorCode.UNAVAILABLE
    assert sorted(s for s, method, *_ in shards.sent if method == "DELETE") == list(range(SHARDS))


def test_a_failed_rotation_leaves_the_old_token_on_the_token_shard() -> None:
    shards = Shards()
    old = body_of(run(shards, "POST", "/v1/admin/tokens", {"bucket": BUCKET, "scope": "read"}))
    shards.sent.clear()
    shards.down.add(next(s for s in range(SHARDS) if s != TOKEN_SHARD))
    with pytest.raises(TieredError):
        run(shards, "POST", f"/v1/admin/tokens/{old['id']}/rotate", {"grace_s": 0})
    assert (TOKEN_SHARD, "PUT") not in [(s, m) for s, m, *_ in shards.sent]  # never reached: old token kept
    assert old["id"] in shards.tables[TOKEN_SHARD]
    assert all(len(table) <= 1 for table in shards.tables)  # the new id revoked wherever it landed
    shards.down.clear()
    answer = run(shards, "POST", f"/v1/admin/tokens/{old['id']}/rotate", {"grace_s": 60})  # the retry
    new = body_of(answer)
    assert answer.status == 201 and new["replaces"] == old["id"]
    assert shards.sent[-1][:2] == (TOKEN_SHARD, "PUT")  # the token shard last
    assert all(new["id"] in table for table in shards.tables)


def test_revocation_answers() -> None:
    shards = Shards()
    token = body_of(run(shards, "POST", "/v1/admin/tokens", {"bucket": BUCKET, "scope": "read"}))
    del shards.tables[0][token["id"]]  # already revoked on one shard
    assert run(shards, "DELETE", f"/v1/admin/tokens/{token['id']}").status == 204
    assert run(shards, "DELETE", f"/v1/admin/tokens/{token['id']}").status == 404
    again = body_of(run(shards, "POST", "/v1/admin/tokens", {"bucket": BUCKET, "scope": "read"}))
    shards.down.add(2)
    with pytest.raises(TieredError) as info:
        run(shards, "DELETE", f"/v1/admin/tokens/{again['id']}")
    assert info.value.code is ErrorCode.UNAVAILABLE
    assert again["id"] in shards.tables[2]  # still there: the retry must reach it
    shards.down.clear()
    assert run(shards, "DELETE", f"/v1/admin/tokens/{again['id']}").status == 204
    assert all(table == {} for table in shards.tables)


def test_reads_go_to_one_shard_unsigned() -> None:
    shards = Shards()
    token = body_of(run(shards, "POST", "/v1/admin/tokens", {"bucket": BUCKET, "scope": "read"}))
    shards.sent.clear()
    assert run(shards, "GET", f"/v1/admin/tokens/{token['id']}").status == 200
    assert shards.sent == [(TOKEN_SHARD, "GET", f"/v1/admin/tokens/{token['id']}", False)]
