"""Glob patterns over stream paths: one rule and one matcher for subscriptions and consumer groups.

``*`` matches exactly one whole path segment; ``**`` matches zero or more whole
segments. Wildcards are whole segments only (``ev/*x`` is refused), literal
segments follow the stream path rules, and nothing matches under the
protocol's reserved ``__ds/`` prefix. Patterns compile once to a regex over
``"/" + path``.
"""

from __future__ import annotations

import re
from functools import lru_cache

from tiered.core.errors import ErrorCode, TieredError
from tiered.core.ids import MAX_STREAM_PATH, validate_stream_path

RESERVED_SEGMENT = "__ds"


def validate_glob(raw: object, *, code: ErrorCode = ErrorCode.BAD_REQUEST) -> str:
    """The pattern (surrounding slashes dropped) if it follows the rule; ``code`` otherwise."""
    if not isinstance(raw, str):
        raise TieredError(code, "pattern must be a string")
    pattern = raw.strip("/")
    if not pattern or len(pattern.encode("utf-8", "surrogatepass")) > MAX_STREAM_PATH:
        raise TieredError(code, f"pattern must be 1-{MAX_STREAM_PATH} bytes")
    segments = pattern.split("/")
    literal = []
    for seg in segments:
        if seg in ("*", "**"):
            literal.append("x")
        elif "*" in seg:
            raise TieredError(
                code, "pattern wildcards must be whole path segments: * (one segment) or ** (any number)"
            )
        else:
            literal.append(seg)
    try:
        validate_stream_path("/".join(literal), code=code, what=f"pattern {raw!r}")
    except TieredError as exc:
        raise TieredError(code, exc.message) from None
    if segments[0] == RESERVED_SEGMENT:
        raise TieredError(code, f"pattern {raw!r} is under the reserved {RESERVED_SEGMENT}/ prefix")
    return pattern


@lru_cache(maxsize=1024)
def compile_glob(pattern: str) -> re.Pattern[str]:
    """A regex that full-matches ``"/" + path`` for the paths ``pattern`` selects."""
    rx = []
    for seg in pattern.split("/"):
        if seg == "**":
            rx.append("(?:/[^/]+)*")
        else:
            rx.append("/" + "[^/]*".join(re.escape(part) for part in seg.split("*")))
    return re.compile("".join(rx), re.DOTALL)


def glob_match(pattern: str, path: str) -> bool:
    return compile_glob(pattern).fullmatch("/" + path) is not None
