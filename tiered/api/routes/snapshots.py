"""Stream snapshot routes: publish, discovery, snapshot reads and the bootstrap read, on a stream's own URL.

They are requests to the stream URL told apart by their query (as
YJS-PROTOCOL.md's ``offset=snapshot`` is), so they are the stream rows of the
route table (``tiered.api.table``): the same scope (a publish is a ``PUT``,
which needs write; the reads are ``GET``, which need read), the same usage
class and, in cluster mode, the same shard key as the stream itself.
``StreamRoutes`` hands them here:

* ``PUT {stream}?snapshot=<offset>``: publish (body: the snapshot, its own
  ``Content-Type``); ``If-Match: <ETag>`` names the snapshot it replaces,
  ``If-None-Match: *`` only if there is none; ``Stream-Snapshot-Retain: true``
  advances the retained offset to it. 204 with ``Stream-Snapshot-Offset``,
  ``ETag``, ``Stream-Next-Offset``.
* ``GET {stream}?offset=snapshot``: 307 to ``?offset=<offset>_snapshot``, or to
  ``?offset=-1`` without a snapshot (YJS-PROTOCOL.md section 5.2).
* ``GET {stream}?offset=<offset>_snapshot``: the snapshot's body,
  ``Stream-Next-Offset: <offset>`` (section 5.3); 404 once replaced.
* ``GET {stream}?bootstrap``: ``multipart/mixed``: the snapshot part, then one
  part of every message after it (as a catch-up read of that range answers),
  ``Stream-Next-Offset`` to tail from (Ursula's bootstrap).

docs/snapshots.md says what each choice follows, and where it departs.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from tiered.api.kit.types import Request, Response
from tiered.core.content import json_messages_to_array, valid_media_type
from tiered.core.errors import bad_request
from tiered.core.ids import format_offset, parse_offset
from tiered.engine.streams import snapshots
from tiered.engine.streams.model import Stream
from tiered.engine.streams.snapshot_service import Bootstrap, SnapshotService

DISCOVERY_CACHE = "private, max-age=5"  # YJS-PROTOCOL.md section 5.2
NO_SNAPSHOT = "-1"  # Stream-Snapshot-Offset of a bootstrap without a snapshot (Ursula's)
RETAIN_HEADER = "Stream-Snapshot-Retain"


def wants_snapshot_read(query: Mapping[str, str], offset_raw: str | None) -> bool:
    """Whether a GET of a stream is one of these routes (cheap: every read asks)."""
    return (offset_raw is not None and offset_raw.endswith(snapshots.DISCOVERY)) or "bootstrap" in query


def snapshot_headers(s: Stream, headers: dict[str, str]) -> None:
    """``HEAD``'s: the newest snapshot's offset and identity."""
    snap = s.snapshot
    if snap is not None:
        headers["Stream-Snapshot-Offset"] = format_offset(snap.offset)
        headers["Stream-Snapshot-ETag"] = snapshots.etag(snap)


class SnapshotRoutes:
    def __init__(self, service: SnapshotService) -> None:
        self.service = service

    # ------------------------------------------------------------- publish

    async def publish(self, request: Request, bucket: str, path: str) -> Response:
        h = request.headers
        raw = request.query.get("snapshot", "")
        offset = parse_offset(raw)
        if offset is None:
            raise bad_request(f"malformed snapshot offset {raw!r}")
        content_type = h.get("Content-Type") or snapshots.DEFAULT_SNAPSHOT_TYPE
        if not valid_media_type(content_type):
            raise bad_request(f"invalid Content-Type {content_type!r}")
        if_none = h.get("If-None-Match")
        if if_none is not None and if_none.strip() != "*":
            raise bad_request("If-None-Match on a snapshot publish must be *")
        if_match = h.get("If-Match")
        retain_raw = h.get(RETAIN_HEADER)
        if retain_raw is not None and retain_raw.lower() not in ("true", "false"):
            raise bad_request(f"{RETAIN_HEADER} must be true or false")
        retain = retain_raw is not None and retain_raw.lower() == "true"
        body = await request.body()
        done = await self.service.publish(
            bucket,
            path,
            offset,
            body,
            content_type,
            if_match=if_match.strip() if if_match is not None else None,
            if_none_match=if_none is not None,
            retain=retain,
        )
        s, snap = done.stream, done.snapshot
        headers = {
            "Stream-Snapshot-Offset": format_offset(snap.offset),
            "ETag": snapshots.etag(snap),
            "Stream-Next-Offset": format_offset(self.service.streams.view(s).tail),
            "Stream-Retained-Offset": format_offset(s.retained_from),
        }
        return Response(204, headers)

    # ------------------------------------------------------------- reads

    async def read(self, request: Request, bucket: str, path: str) -> Response:
        """A GET that ``wants_snapshot_read``: discovery, a snapshot's body, or the bootstrap read."""
        q = request.query
        offset_raw = q.get("offset")
        if request.target.live is not None:
            raise bad_request("snapshot and bootstrap reads are not live: tail from their Stream-Next-Offset")
        if "bootstrap" in q:
            if offset_raw is not None:
                raise bad_request("a bootstrap read starts at the stream's snapshot: send no offset")
            return await self.bootstrap(bucket, path)
        assert offset_raw is not None
        s = self.service.streams.lookup(bucket, path)
        if offset_raw == snapshots.DISCOVERY:
            token = snapshots.token(s.snapshot) if s.snapshot is not None else "-1"
            location = (request.origin or "") + request.target.path + "?offset=" + token
            return Response(307, {"Location": location, "Cache-Control": DISCOVERY_CACHE})
        offset = snapshots.parse_token(offset_raw)
        if offset is None:
            raise bad_request(f"malformed offset {offset_raw!r}")
        snap = snapshots.snapshot_at(s, offset)
        body = await self.service.body(snap)
        headers = {
            "Content-Type": snap.content_type,
            "Stream-Next-Offset": format_offset(snap.offset),
            "Stream-Snapshot-Offset": format_offset(snap.offset),
            "ETag": snapshots.etag(snap),
            "Cache-Control": "no-store",
        }
        return Response(200, headers, body)

    async def bootstrap(self, bucket: str, path: str) -> Response:
        b = await self.service.bootstrap(bucket, path)
        boundary = _boundary(b)
        headers = {
            "Content-Type": f'multipart/mixed; boundary="{boundary}"',
            "Stream-Next-Offset": format_offset(b.end),
            "Stream-Snapshot-Offset": format_offset(b.snapshot.offset) if b.snapshot else NO_SNAPSHOT,
            "Cache-Control": "no-store",
        }
        if b.up_to_date:
            headers["Stream-Up-To-Date"] = "true"
        if b.closed:
            headers["Stream-Closed"] = "true"
        return Response(200, headers, multipart(b, boundary))


def _updates_body(b: Bootstrap) -> bytes:
    """The updates as a catch-up read of ``[start, end)`` answers them (a JSON stream: one array)."""
    return json_messages_to_array(b.updates) if b.stream.json else b.updates


def _boundary(b: Bootstrap) -> str:
    while True:
        boundary = "tiered-" + secrets.token_hex(16)
        marker = boundary.encode()
        if marker not in b.body and marker not in b.updates:
            return boundary


def multipart(b: Bootstrap, boundary: str) -> bytes:
    """Two parts: the snapshot (empty without one), then the updates after it."""
    snap = b.snapshot
    first = [
        f"Content-Type: {snap.content_type if snap else snapshots.DEFAULT_SNAPSHOT_TYPE}",
        f"Stream-Snapshot-Offset: {format_offset(snap.offset) if snap else NO_SNAPSHOT}",
        f"Content-Length: {len(b.body)}",
    ]
    updates = _updates_body(b)
    second = [
        f"Content-Type: {b.stream.content_type}",
        f"Stream-Offset: {format_offset(b.start)}",
        f"Stream-Next-Offset: {format_offset(b.end)}",
        f"Content-Length: {len(updates)}",
    ]
    out = bytearray()
    for part_headers, data in ((first, b.body), (second, updates)):
        out += f"--{boundary}\r\n".encode()
        out += ("\r\n".join(part_headers) + "\r\n\r\n").encode()
        out += data
        out += b"\r\n"
    out += f"--{boundary}--\r\n".encode()
    return bytes(out)
