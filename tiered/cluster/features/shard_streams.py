"""A shard's live streams of one bucket, asked for by another shard's group coordinator (cluster mode).

Each shard's engine gets, in its constructor, a ``ShardDirectory``
(``directory.py``) whose ``ask`` is ``ask_shard`` (and a quota view of the
other shards: ``bucket_totals_exchange.py``); both are hooks of the engine
(``tiered/cluster/compose.py``), in place before it serves and before its
group sweeper can run, so no plan is ever made on this shard's streams alone
(that plan would drop the cursors of every stream elsewhere) and no write is
admitted against this shard's usage alone.

Another shard is asked through its engine when it is served here, else with
``GET /v1/cluster/shards/{shard}/streams?bucket=B`` to its owner (the node
route ``streams_route`` answers it from the owner's engine; it refuses with
503 ``SHARD_NOT_OWNED`` when the shard is not served there). The request is
signed with the cluster secret (``tiered/cluster/membership/secret.py``) and the route accepts nothing
else (401): no admin token is needed between nodes.
"""

from __future__ import annotations

from urllib.parse import quote

import msgspec

from tiered.api.kit.types import Request, Response, json_response
from tiered.cluster.features.directory import Listing, engine_listing
from tiered.cluster.gateway.forward import Forwarder
from tiered.cluster.gateway.shard_router import ShardView
from tiered.cluster.membership.secret import SIGNATURE_HEADER, NodeSigner, target_of
from tiered.core.errors import ErrorCode, TieredError, bad_request

__all__ = ["STREAMS_ROUTE", "ask_shard", "serve_streams", "streams_path"]

#: The node route other nodes ask a shard's streams with.
STREAMS_ROUTE = "/v1/cluster/shards/{shard}/streams"


def streams_path(shard: int) -> str:
    return STREAMS_ROUTE.replace("{shard}", str(shard))


class _Listed(msgspec.Struct):
    shard: int
    bucket: str
    streams: list[tuple[str, int, int]]  # (path, uid, visible tail)
    # path -> retained offset, for the streams whose retained offset is past 0. With a default:
    # a node without it still answers (its streams then look unretained until it is upgraded).
    retained: dict[str, int] = {}


def _to_wire(shard: int, bucket: str, rows: Listing) -> _Listed:
    streams = [(path, uid, tail) for path, uid, tail, _ in rows]
    return _Listed(shard, bucket, streams, {path: r for path, _, _, r in rows if r > 0})


def _from_wire(listed: _Listed) -> Listing:
    return [(path, uid, tail, listed.retained.get(path, 0)) for path, uid, tail in listed.streams]


async def ask_shard(
    view: ShardView, forwarder: Forwarder, signer: NodeSigner | None, shard: int, bucket: str
) -> Listing:
    """Shard ``shard``'s live streams of ``bucket``: from its engine here, or from its owner."""
    engine = view.local_engine(shard)
    if engine is not None:
        return engine_listing(engine, bucket)
    owner = view.owner_url(shard)
    if owner is None or owner[0] == view.node_id:
        raise TieredError(
            ErrorCode.SHARD_NOT_OWNED, f"shard {shard} has no serving owner right now", retry_after_s=1
        )
    query = f"bucket={quote(bucket, safe='')}"
    headers = {"Accept": "application/json"}
    if (
        signer is not None
    ):  # a node's request: signed with the cluster secret (tiered/cluster/membership/secret.py)
        headers[SIGNATURE_HEADER] = signer.header("GET", target_of(streams_path(shard), query), "", b"")

    async def no_body() -> bytes:
        return b""

    request = Request("GET", streams_path(shard), query, headers, no_body)
    response = await forwarder.forward(request, owner[1], shard)
    if response.status != 200 or not isinstance(response.body, bytes):
        raise TieredError(
            ErrorCode.SHARD_NOT_OWNED,
            f"shard {shard}'s owner answered {response.status} to a listing of its streams",
            retry_after_s=1,
        )
    listed = msgspec.json.decode(response.body, type=_Listed)
    if listed.shard != shard or listed.bucket != bucket:
        raise TieredError(ErrorCode.SHARD_NOT_OWNED, f"shard {shard}: a listing of another shard came back")
    return _from_wire(listed)


async def serve_streams(view: ShardView, signer: NodeSigner | None, request: Request) -> Response:
    """The node route: one served shard's live streams of one bucket (for nodes only: signed requests)."""
    header = request.headers.get(SIGNATURE_HEADER)
    if header is None or signer is None:
        raise TieredError(
            ErrorCode.UNAUTHORIZED, "a node route: only the cluster's nodes may call it (signed requests)"
        )
    signer.verify(header, request.method, target_of(request.path, request.query_string), "", b"")
    raw = request.params.get("shard", "")
    bucket = request.query.get("bucket")
    if not raw.isdigit() or bucket is None:
        raise bad_request("GET /v1/cluster/shards/{shard}/streams?bucket=B")
    shard = int(raw)
    engine = view.local_engine(shard)
    if engine is None:
        raise TieredError(
            ErrorCode.SHARD_NOT_OWNED, f"shard {shard} is not served here", shard=shard, retry_after_s=1
        )
    body = _to_wire(shard, bucket, engine_listing(engine, bucket))
    return json_response(msgspec.to_builtins(body), headers={"Cache-Control": "no-store"})
