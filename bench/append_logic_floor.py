#!/usr/bin/env python3
"""The least an append's own logic can cost in CPython: a lower bound, not a server.

What any implementation of an append must compute once the request is parsed, written as directly as
Python allows, with no layers: find the stream from the path, check the content type and the absence
of the optional headers (producer, sequence, conditional, close), encode a journal record with msgspec,
frame it with a CRC into the log buffer, hash the body for the stream's digest, advance the stream's
offsets and counters and the bucket's usage, and build the answer's ``Stream-Next-Offset``. Nothing is
written to disk and nobody waits (``bench/null_server.py --journal`` models the group commit and the
HTTP stack; this is the work between them).

Together the two place tiered's ~45 µs of own Python per append: the logic itself is a few µs, the rest
is the structure around it (docs/benchmarks.md, "what bounds a served append").

    python bench/append_logic_floor.py --appends 200000

No I/O; bounded by ``--appends``.
"""

from __future__ import annotations

import argparse
import hashlib
import struct
import time
import zlib

import msgspec

OCTET = "application/octet-stream"
FRAME = struct.Struct("<II")
OPTIONAL = ("producer-id", "producer-epoch", "producer-seq", "stream-seq", "stream-closed", "if-match")


class Appended(msgspec.Struct, array_like=True, frozen=True):
    """A journal record of one append, as small as it can be."""

    stream: str
    offset: int
    body: bytes
    at_ns: int


class StreamRow:
    __slots__ = ("content_type", "count", "digest", "next_offset")

    def __init__(self, content_type: str) -> None:
        self.content_type = content_type
        self.next_offset = 0
        self.count = 0
        self.digest = 0


def run(appends: int, streams: int, size: int) -> float:
    """CPU seconds per append over ``appends`` appends round-robin on ``streams`` streams."""
    encode = msgspec.msgpack.Encoder().encode
    table = {f"s{i}": StreamRow(OCTET) for i in range(streams)}
    usage = [0, 0]
    log = bytearray()
    headers = {"content-type": OCTET, "content-length": str(size), "host": "127.0.0.1"}
    body = b"x" * size
    paths = [f"/v1/stream/s{i}" for i in range(streams)]

    def append(path: str, headers: dict[str, str], body: bytes) -> tuple[int, dict[str, str] | None]:
        if not path.startswith("/v1/stream/"):
            return 404, None
        row = table.get(path[11:])
        if row is None:
            return 404, None
        content_type = headers.get("content-type")
        if content_type is not None and content_type != row.content_type:
            return 409, None
        for name in OPTIONAL:
            if headers.get(name) is not None:
                return 400, None
        record = encode(Appended(path[11:], row.next_offset, body, time.time_ns()))
        log.extend(FRAME.pack(len(record), zlib.crc32(record)))
        log.extend(record)
        row.digest ^= int.from_bytes(hashlib.sha256(body).digest()[:8], "little")
        row.next_offset += len(body)
        row.count += 1
        usage[0] += 1
        usage[1] += len(body)
        return 204, {"Stream-Next-Offset": f"{0:016d}_{row.next_offset:016d}"}

    t0 = time.process_time()
    for i in range(appends):
        status, _ = append(paths[i % streams], headers, body)
        assert status == 204
        if len(log) > 1 << 24:
            log.clear()
    return (time.process_time() - t0) / appends


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--appends", type=int, default=200_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    runs = [run(a.appends, a.streams, a.size) for _ in range(a.rounds)]
    print(f"{min(runs) * 1e6:.2f} µs CPU per append (rounds: {', '.join(f'{r * 1e6:.2f}' for r in runs)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
