"""SSE framing: data and control events, and where a text chunk may end.

Pure functions: the read path (``tiered.api.routes.streams``) decides what to send,
these decide how it looks on the wire.
"""

from __future__ import annotations

import base64

import msgspec

from tiered.core.content import json_messages_to_array
from tiered.core.ids import format_offset


def utf8_boundary(data: bytes) -> int:
    """Length of ``data`` without a trailing incomplete UTF-8 sequence."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b < 0x80:
            return n
        if b >= 0xC0:  # a lead byte: is its sequence complete?
            need = 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return n if back >= need else n - back
    return n


def data_event(data: bytes, json_mode: bool, binary: bool) -> bytes:
    if binary:
        text = base64.b64encode(data)
        lines = [text[i : i + 76] for i in range(0, len(text), 76)] or [b""]
    else:
        payload = json_messages_to_array(data) if json_mode else data
        # Splitting on every line terminator means stream bytes can never start
        # a new SSE field or event (no CR/LF injection).
        lines = payload.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
    out = bytearray(b"event: data\n")
    for line in lines:
        # Parsers drop one space after "data:", so a line that itself starts
        # with a space gets an extra one to keep it; others go unpadded.
        out += (b"data: " if line.startswith(b" ") else b"data:") + line + b"\n"
    out += b"\n"
    return bytes(out)


def control_event(next_offset: int, cursor: str | None, up_to_date: bool, closed: bool) -> bytes:
    control: dict[str, object] = {"streamNextOffset": format_offset(next_offset)}
    if cursor is not None and not closed:
        control["streamCursor"] = cursor
    if up_to_date:
        control["upToDate"] = True
    if closed:
        control["streamClosed"] = True
    return b"event: control\ndata:" + msgspec.json.encode(control) + b"\n\n"


def credential_event(next_offset: int, reason: str) -> bytes:
    """The last event of a read whose credential ended: where to resume, and why it stops.

    ``{"streamNextOffset": ..., "credentialExpired": true}`` (or
    ``"credentialRevoked"``); a client resumes from that offset with a new
    credential (reconnecting with the old one gets 401).
    """
    key = "credentialRevoked" if reason == "revoked" else "credentialExpired"
    control = {"streamNextOffset": format_offset(next_offset), key: True}
    return b"event: control\ndata:" + msgspec.json.encode(control) + b"\n\n"
