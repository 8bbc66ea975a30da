"""Keyed compaction on the wire: water marks in HEAD, and reads of a compacted range that skip its holes.

The rules live in ``tiered.engine.streams.keyed``; this module only puts them
on HTTP. A read of a range with holes serves the live messages in it (whole
messages: keyed streams are JSON streams) and a ``Stream-Next-Offset`` past
any hole it ends in, so a reader never waits on removed offsets.
"""

from __future__ import annotations

from tiered.api.kit.types import Response
from tiered.core.content import json_messages_to_array
from tiered.core.errors import bad_request
from tiered.core.ids import format_offset
from tiered.engine.streams.header_keys import is_header_keyed
from tiered.engine.streams.keyed import low_water_mark, parse_key_query, read_live_chunk
from tiered.engine.streams.model import Stream
from tiered.engine.streams.service import StreamService


def keyed_headers(s: Stream, tail: int, headers: dict[str, str]) -> None:
    """``Stream-Low-Water-Mark`` (first readable offset), ``Stream-High-Water-Mark`` (the tail), and
    ``Stream-Compaction-Key`` for a keyed stream."""
    headers["Stream-Low-Water-Mark"] = format_offset(low_water_mark(s, tail))
    headers["Stream-High-Water-Mark"] = format_offset(tail)
    if s.compaction_key is not None:
        headers["Stream-Compaction-Key"] = s.compaction_key


async def header_key_response(service: StreamService, s: Stream, tail: int, raw: str) -> Response:
    """``GET {stream}?key=K`` of a stream keyed by header: ``K`` as sent in ``Stream-Key`` (raw text, as
    the ``durable-streams-keyed`` fork reads it); the newest append of ``K`` as a read of its range would
    serve it (a JSON stream's messages as an array), its offset in ``Stream-Key-Offset``, the key in
    ``Stream-Key``; 404 ``KEY_NOT_FOUND`` when it has none or was deleted (then ``Stream-Key-Offset``
    names the tombstone)."""
    entry, data = await service.read_key(s, raw)
    headers = {
        "Content-Type": s.content_type,
        "Stream-Key": entry.key,
        "Stream-Key-Offset": format_offset(entry.start),
        "Stream-Next-Offset": format_offset(tail),
        "Cache-Control": "no-store",
    }
    return Response(200, headers, json_messages_to_array(data) if s.json else data)


async def key_response(service: StreamService, s: Stream, tail: int, raw: str) -> Response:
    """``GET {stream}?key=K``: the newest message of key ``K`` (its JSON text: ``"abc"`` or ``7``) as
    the body, its offset in ``Stream-Key-Offset``; 404 ``KEY_NOT_FOUND`` when the key has none or
    was deleted; 400 on a stream that is not keyed or a key that is not a string or an integer.
    A stream keyed by header answers ``header_key_response``'s way; the others read the compactor's
    key index plus what follows it (``tiered.engine.streams.key_reads``)."""
    if is_header_keyed(s):
        return await header_key_response(service, s, tail, raw)
    if s.compaction_key is None:
        raise bad_request("key reads need a keyed stream (created with Stream-Compaction-Key)")
    offset, message = await service.read_pointer_key(s, tail, parse_key_query(raw))
    headers = {
        "Content-Type": s.content_type,
        "Stream-Key-Offset": format_offset(offset),
        "Stream-Next-Offset": format_offset(tail),
        "Cache-Control": "no-store",
    }
    return Response(200, headers, message.rstrip(b"\n"))


__all__ = ["header_key_response", "key_response", "keyed_headers", "read_live_chunk"]
