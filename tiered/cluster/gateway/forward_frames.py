"""The frames a worker forwards a request in, and the owner answers in (pure: bytes in, values out).

A request that lands on the wrong worker of a multi-worker node
(``tiered/cluster/workers/``) was already parsed by that worker: its HTTP
head, its target (``tiered.api.kit.target``), its body. Sending it on as a
second HTTP request made the owner parse it all again and cost the two
workers 1.45 times a whole append (``docs/benchmarks.md``). A frame carries
the parsed request instead: its method, raw path and query, its headers
(lower-case names, hop-by-hop ones dropped), the scheme and host the client
used, the request id, and the target exactly as the receiving worker parsed
and routed it, so the owner's access check, usage count and route judge the
very value the request was routed by (parse once), never a second reading of
the same text. The body follows the frame's head as it is.

One frame on the wire (numbers big-endian)::

    kind (1 byte) | request id (4 bytes) | meta length (4) | body length (4) | meta (msgpack) | body

=========  =================  ====================================================
kind       meta               body
=========  =================  ====================================================
``ASK``    ``Ask``            the request body (whole)
``WHOLE``  ``Said``           the whole answer body
``HEAD``   ``Said``           none: the answer's body follows in ``CHUNK`` frames
``CHUNK``  none               one piece of a streamed answer (an event stream)
``END``    none               none: the streamed answer ended cleanly
``CUT``    none               none: the streamed answer failed on the owner; the
                              reader must see a cut stream, never a clean end
``CANCEL`` none               none: the sender's client left; the owner stops the
                              request (sender to owner only)
=========  =================  ====================================================

Two kinds of connection (``forward_channel.py``):

* **Multiplexed** (request ids from 1): writes (appends above all) go on one
  shared connection per sibling, many at a time, each answer matched to its
  request by id. Frames written in one turn of the event loop leave in one
  ``write`` on both sides, so a group commit's answers cost the owner one
  system call, not one each. An answer here is always whole (the owner
  collects a streamed one, bounded); a request is stopped by ``CANCEL``.
* **Dedicated** (request id 0): reads, which may stream (SSE, large bodies),
  one at a time on a pooled connection: a streamed answer comes as
  ``HEAD``, ``CHUNK``... ``END``, with flow control by the socket itself (the
  sender stops reading while its client is behind); closing the connection
  stops the request.
The frames travel only over a Unix socket in the node's private socket
directory (mode 0700, the socket 0600): the owner trusts what they say as it
trusts its own parse.
"""

from __future__ import annotations

import struct

import msgspec

from tiered.api.kit.target import Target
from tiered.core.config import Config

__all__ = [
    "ASK",
    "CHUNK",
    "CANCEL",
    "CUT",
    "END",
    "HEAD",
    "HEAD_SIZE",
    "HOP_BY_HOP",
    "MAX_ANSWER",
    "MAX_META",
    "WHOLE",
    "Ask",
    "Frame",
    "FrameError",
    "FrameReader",
    "Said",
    "decode_ask",
    "decode_said",
    "frame",
    "frame_parts",
    "max_answer_bytes",
]

ASK = 0x51  # "Q"
WHOLE = 0x41  # "A"
HEAD = 0x48  # "H"
CHUNK = 0x43  # "C"
END = 0x45  # "E"
CUT = 0x58  # "X"
CANCEL = 0x5A  # "Z"
_KINDS = frozenset({ASK, WHOLE, HEAD, CHUNK, END, CUT, CANCEL})

_HEAD = struct.Struct("!BIII")
HEAD_SIZE = _HEAD.size
#: A frame's meta (method, path, headers) past this is refused: granian bounds a request's head far below.
MAX_META = 1024 * 1024
#: Bodies in one ``WHOLE`` or ``CHUNK`` frame at most concatenated with their head; larger go as a second buffer.
_JOIN_BELOW = 64 * 1024

#: Hop-by-hop headers (RFC 9110 7.6.1): about one connection, never forwarded. ``host`` and
#: ``content-length`` are the request's own and travel with it.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


#: Room in a whole answer beyond the largest body the service puts in one (its JSON envelope, a page of a
#: listing, the parts' heads of a bootstrap read).
_ANSWER_ROOM = 4 * 1024 * 1024
#: ``max_answer_bytes`` unless told (what the default settings give, rounded up).
MAX_ANSWER = 64 * 1024 * 1024


def max_answer_bytes(config: Config) -> int:
    """The largest whole answer a worker takes from a sibling in one frame (a larger frame is refused
    before its body is buffered): the largest body the service answers with whole (a catch-up read's
    chunk, a stream snapshot and its bootstrap updates, a request body echoed back), and room."""
    largest = max(
        config.max_body_bytes,
        config.read_chunk_bytes,
        config.stream_snapshot_max_bytes + config.bootstrap_max_bytes,
    )
    return largest + _ANSWER_ROOM


class FrameError(Exception):
    """Bytes that are not a frame, or one over the limits: the connection carrying them is closed."""


class Ask(msgspec.Struct, array_like=True):
    """A forwarded request, as the worker that received it parsed it."""

    method: str
    path: str  # still percent-encoded, as ``Request.path``
    query_string: str
    headers: dict[str, str]  # lower-case names
    scheme: str
    host: str
    request_id: str
    target: Target | None = None  # the receiver's parse (None: the owner parses, as any request's)


class Said(msgspec.Struct, array_like=True):
    """An answer's status and headers."""

    status: int
    headers: dict[str, str]


_encode = msgspec.msgpack.Encoder().encode
_ask_decoder = msgspec.msgpack.Decoder(Ask)
_said_decoder = msgspec.msgpack.Decoder(Said)


def frame(kind: int, meta: msgspec.Struct | None = None, body: bytes = b"", rid: int = 0) -> bytes:
    """One frame as one buffer (the body copied once: for small bodies and frames without one)."""
    encoded = _encode(meta) if meta is not None else b""
    return _HEAD.pack(kind, rid, len(encoded), len(body)) + encoded + body


def frame_parts(kind: int, meta: msgspec.Struct | None, body: bytes, rid: int = 0) -> list[bytes]:
    """One frame as buffers to write in one call: a large body is never copied into the head's buffer.

    Raises ``UnicodeEncodeError`` for a meta value that is not valid text (a header value the HTTP
    server could not decode): the caller sends that request another way.
    """
    encoded = _encode(meta) if meta is not None else b""
    head = _HEAD.pack(kind, rid, len(encoded), len(body))
    if len(body) < _JOIN_BELOW:
        return [head + encoded + body]
    return [head + encoded, body]


def decode_ask(meta: bytes) -> Ask:
    try:
        return _ask_decoder.decode(meta)
    except msgspec.DecodeError as exc:
        raise FrameError(f"not a forwarded request: {exc}") from exc


def decode_said(meta: bytes) -> Said:
    try:
        return _said_decoder.decode(meta)
    except msgspec.DecodeError as exc:
        raise FrameError(f"not a forwarded answer: {exc}") from exc


Frame = tuple[int, int, bytes, bytes]  # kind, request id, meta, body


class FrameReader:
    """Splits the bytes a connection receives into frames ``(kind, rid, meta, body)``, checked against limits.

    The common case, one whole frame in one read, slices it straight out of
    the bytes read; a frame split over reads is collected first.
    """

    __slots__ = ("_buf", "max_body")

    def __init__(self, max_body: int) -> None:
        self._buf = bytearray()
        self.max_body = max_body

    def feed(self, data: bytes) -> list[Frame]:
        if not self._buf:  # the common case: whole frames read, sliced straight out of the bytes read
            out, start = self._split(data)
            if start < len(data):
                self._buf += data[start:]  # a frame's start: kept until the rest arrives
            return out
        self._buf += data
        out, start = self._split(self._buf)
        if start:
            del self._buf[:start]
        return out

    def _split(self, buf: bytes | bytearray) -> tuple[list[Frame], int]:
        """The whole frames in ``buf``, and where the rest begins."""
        out: list[Frame] = []
        start = 0
        size = len(buf)
        while size - start >= HEAD_SIZE:
            kind, rid, meta_len, body_len = self._head(buf, start)
            at = start + HEAD_SIZE
            meta_end = at + meta_len
            end = meta_end + body_len
            if size < end:
                break
            out.append((kind, rid, bytes(buf[at:meta_end]), bytes(buf[meta_end:end])))
            start = end
        return out, start

    def _head(self, data: bytes | bytearray, at: int = 0) -> tuple[int, int, int, int]:
        kind, rid, meta_len, body_len = _HEAD.unpack_from(data, at)
        if kind not in _KINDS:
            raise FrameError(f"unknown frame kind {kind:#x}")
        if meta_len > MAX_META or body_len > self.max_body:
            raise FrameError(f"a frame over the limits (meta {meta_len} bytes, body {body_len} bytes)")
        return kind, rid, meta_len, body_len

    @property
    def pending(self) -> int:
        """Bytes of a frame received but not yet whole."""
        return len(self._buf)
