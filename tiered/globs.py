"""Glob patterns over stream paths, shared by subscriptions and consumer groups.

``*`` matches within one path segment (alone, a whole segment); ``**`` matches
zero or more whole segments. Patterns compile once to a regex over ``"/" + path``.
"""

from __future__ import annotations

import re
from functools import lru_cache


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
