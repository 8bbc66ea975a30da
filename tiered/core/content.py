"""Content types and JSON mode: how request bodies become stored bytes and back.

JSON streams store each message as compact JSON followed by ``\\n``. Compact
JSON never contains a raw newline, so the newline is an unambiguous message
boundary: a read turns ``a\\nb\\n`` into ``[a,b]`` with one replace, and a fork
sub-offset counts messages by counting newlines.
"""

from __future__ import annotations

import functools

import msgspec

from tiered.core.errors import ErrorCode, TieredError

DEFAULT_CONTENT_TYPE = "application/octet-stream"

_json_decoder = msgspec.json.Decoder()
_json_encoder = msgspec.json.Encoder()


# Every append asks these of its own and its stream's Content-Type, several times over, and a node sees few
# distinct values: remembered (bounded, so a client sending ever-new values only evicts older ones; what a
# request sends is at most 256 bytes by then, ``check_stream_headers`` runs first on every stream route).
@functools.lru_cache(maxsize=1024)
def media_type(content_type: str) -> str:
    """The type/subtype part, lowercased: what stream type comparisons use."""
    return content_type.split(";", 1)[0].strip().lower()


@functools.lru_cache(maxsize=1024)
def is_json(content_type: str) -> bool:
    return media_type(content_type) == "application/json"


def is_text_like(content_type: str) -> bool:
    """SSE sends these as UTF-8 text; everything else is base64."""
    mt = media_type(content_type)
    return mt.startswith("text/") or mt == "application/json"


@functools.lru_cache(maxsize=1024)
def valid_media_type(content_type: str) -> bool:
    mt = media_type(content_type)
    main, sep, sub = mt.partition("/")
    return bool(sep and main and sub) and " " not in mt


def _decode(body: bytes) -> object:
    try:
        return _json_decoder.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        # Includes numbers beyond float range: no finite JSON form to store.
        raise TieredError(ErrorCode.BAD_REQUEST, f"invalid JSON: {exc}") from None


def encode_json_messages(body: bytes, *, allow_empty_array: bool) -> bytes:
    """Validate a JSON body and return it as stored messages (one per line).

    A top-level array is flattened one level; an empty array stores nothing
    and is only allowed where the caller says so (PUT, not POST).
    """
    value = _decode(body)
    messages = value if isinstance(value, list) else [value]
    if not messages and not allow_empty_array:
        raise TieredError(ErrorCode.BAD_REQUEST, "an empty JSON array appends nothing")
    out = bytearray()
    for message in messages:
        out += _json_encoder.encode(message)
        out += b"\n"
    return bytes(out)


def json_messages_to_array(stored: bytes) -> bytes:
    """Render stored messages as the JSON array a read returns."""
    if not stored:
        return b"[]"
    return b"[" + stored[:-1].replace(b"\n", b",") + b"]"


def count_json_messages(stored: bytes) -> int:
    return stored.count(b"\n")
