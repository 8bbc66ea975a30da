"""Routing: method and path pattern to handler, matched on the raw (still percent-encoded) path.

Patterns are literal segments and ``{name}`` (one segment) or ``{name...}``
(the rest of the path, any characters, including encoded newlines, so bad
names reach validation and a 400 rather than missing the route). Routes are
tried in the order added: put the hottest first.
"""

from __future__ import annotations

import re

from tiered.errors import ErrorCode, TieredError

from .types import Handler, Request, Response

_PARAM = re.compile(r"\{(\w+)(\.\.\.)?\}")
_UNRESERVED_ESCAPE = re.compile(r"%(2[DdEe]|3[0-9]|[46][1-9A-Fa-f]|[57][0-9Aa]|5[Ff]|7[Ee])")


def normalize_path(path: str) -> str:
    """Decode percent-escapes of unreserved characters (RFC 3986 6.2.2.2): same URI, one spelling.

    ``/v1/stream/%5F%5Fds/...`` is ``/v1/stream/__ds/...``, so it routes the same;
    escapes of reserved characters (``%2F``, ``%3F``...) stay as they are.
    """
    if "%" not in path:
        return path
    return _UNRESERVED_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), path)


def _compile(pattern: str) -> re.Pattern[str]:
    out, pos = [], 0
    for m in _PARAM.finditer(pattern):
        out.append(re.escape(pattern[pos : m.start()]))
        out.append(f"(?P<{m.group(1)}>[\\s\\S]*)" if m.group(2) else f"(?P<{m.group(1)}>[^/]+)")
        pos = m.end()
    out.append(re.escape(pattern[pos:]))
    return re.compile("".join(out))


class Router:
    def __init__(self) -> None:
        # (literal prefix, pattern, handlers by method): the prefix check skips most regexes.
        self._routes: list[tuple[str, re.Pattern[str], dict[str, Handler]]] = []
        self._by_pattern: dict[str, dict[str, Handler]] = {}

    def add(self, methods: str, pattern: str, handler: Handler) -> None:
        """``methods``: space-separated, or ``*`` for any (the handler then checks)."""
        table = self._by_pattern.get(pattern)
        if table is None:
            table = self._by_pattern[pattern] = {}
            self._routes.append((pattern.split("{", 1)[0], _compile(pattern), table))
        for method in methods.split():
            table[method] = handler

    async def __call__(self, request: Request) -> Response:
        path = request.path = normalize_path(request.path)
        for prefix, rx, table in self._routes:
            if not path.startswith(prefix):
                continue
            m = rx.fullmatch(path)
            if m is None:
                continue
            handler = table.get(request.method) or table.get("*")
            if handler is None and request.method == "HEAD":
                handler = table.get("GET")
            if handler is None:
                allowed = ", ".join(sorted(table))
                raise TieredError(
                    ErrorCode.METHOD_NOT_ALLOWED,
                    f"method {request.method} is not allowed here",
                    allow=allowed,
                )
            request.params = m.groupdict()
            return await handler(request)
        raise TieredError(ErrorCode.NOT_FOUND, "no such route")
