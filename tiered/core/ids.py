"""Names and offsets as the outside world sees them, validated in one place.

Offsets are the byte position in a stream's logical byte sequence, printed as
a 32-digit zero-padded decimal split 16_16 (the shape the protocol's reference
server uses, which clients and the conformance suite have come to expect), so
they sort lexicographically. A position never changes when data moves between
tiers, and forks share their source's offset space.

Offsets are never reused at a path: a stream created where an earlier one was
deleted or expired starts one above the highest offset the path ever issued
(``tiered.engine.streams.lifecycle``), so every old offset is below the new stream's
first one and reads refuse it as gone instead of serving new bytes. (Not at
the next multiple of 10^16, which would show the incarnation in the high half:
about 920 re-creations of one path would overflow the signed 64-bit offsets of
hot chunk arrays and Parquet columns.)
"""

from __future__ import annotations

import re

from tiered.core.errors import ErrorCode, TieredError

_HALF = 10**16
_OFFSET_RE = re.compile(r"[0-9]{16}_[0-9]{16}")

DEFAULT_BUCKET = "default"
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
# Stream paths never reach the filesystem, but they do reach logs, headers and
# object metadata: no C0/C1 control characters, backslashes, or "." / ".." segments.
_SEGMENT_RE = re.compile(r"[^\x00-\x1f\x7f-\x9f/\\]+")
MAX_STREAM_PATH = 1024


def format_offset(pos: int) -> str:
    return f"{pos // _HALF:016d}_{pos % _HALF:016d}"


def parse_offset(token: str) -> int | None:
    """Return the byte position of a server-minted offset, or None if malformed."""
    if len(token) != 33 or not _OFFSET_RE.fullmatch(token):
        return None
    return int(token[:16]) * _HALF + int(token[17:])


def validate_bucket(name: str, *, code: ErrorCode = ErrorCode.BAD_REQUEST) -> str:
    if not _BUCKET_RE.fullmatch(name):
        raise TieredError(
            code,
            "bucket names are 3-63 characters of lowercase letters, digits and '-', "
            "starting and ending with a letter or digit",
        )
    return name


def validate_stream_path(
    path: str, *, code: ErrorCode = ErrorCode.BAD_REQUEST, what: str = "stream path"
) -> str:
    if not path:
        raise TieredError(code, f"{what} is empty")
    try:
        size = len(path.encode())
    except UnicodeEncodeError:
        raise TieredError(code, f"{what} is not valid Unicode") from None
    if size > MAX_STREAM_PATH:
        raise TieredError(code, f"{what} is longer than {MAX_STREAM_PATH} bytes")
    for segment in path.split("/"):
        if segment in ("", ".", ".."):
            raise TieredError(code, f"{what} segments must be non-empty and not '.' or '..'")
        if not _SEGMENT_RE.fullmatch(segment):
            raise TieredError(code, f"{what} segment {segment!r} contains characters that are not allowed")
    return path
