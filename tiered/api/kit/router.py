"""Routing: method and path pattern to handler, matched on the raw (still percent-encoded) path.

Patterns are literal segments and ``{name}`` (one segment) or ``{name...}``
(the rest of the path, any characters, including encoded newlines, so bad
names reach validation and a 400 rather than missing the route). Routes are
tried in the order added: put the hottest first.

Every route has a label, its name in metrics (``tiered_http_requests_total``):
the pattern, unless the route names itself (stream operations share one
pattern and are labelled ``append``, ``read``...). A request no route matches
is labelled ``unmatched``. Labels never hold anything the client sent. A
request refused before it reached the router (by the auth layer) gets its
label from ``label`` when it is counted: only refusals pay a second match.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from tiered.api.kit.target import normalize_path
from tiered.api.kit.types import UNMATCHED, Handler, Request, Response
from tiered.core.errors import ErrorCode, TieredError

__all__ = ["Route", "Router", "normalize_path"]

_PARAM = re.compile(r"\{(\w+)(\.\.\.)?\}")


def _compile(pattern: str) -> re.Pattern[str]:
    out, pos = [], 0
    for m in _PARAM.finditer(pattern):
        out.append(re.escape(pattern[pos : m.start()]))
        out.append(f"(?P<{m.group(1)}>[\\s\\S]*)" if m.group(2) else f"(?P<{m.group(1)}>[^/]+)")
        pos = m.end()
    out.append(re.escape(pattern[pos:]))
    return re.compile("".join(out))


class Route(NamedTuple):
    handler: Handler
    label: str


class Router:
    def __init__(self) -> None:
        # (literal prefix, regex, pattern, routes by method): the prefix check skips most regexes.
        self._routes: list[tuple[str, re.Pattern[str], str, dict[str, Route]]] = []
        self._by_pattern: dict[str, dict[str, Route]] = {}

    def add(self, methods: str, pattern: str, handler: Handler, *, label: str | None = None) -> None:
        """``methods``: space-separated, or ``*`` for any (the handler then checks).

        ``label``: the route's name in metrics (default: ``pattern``).
        """
        table = self._by_pattern.get(pattern)
        if table is None:
            table = self._by_pattern[pattern] = {}
            self._routes.append((pattern.split("{", 1)[0], _compile(pattern), pattern, table))
        for method in methods.split():
            table[method] = Route(handler, label or pattern)

    def _find(self, request: Request, path: str) -> tuple[re.Match[str], str, Route | None] | None:
        """The first route whose pattern matches ``path``: (match, pattern, route for the method or None)."""
        for prefix, rx, pattern, table in self._routes:
            if not path.startswith(prefix):
                continue
            m = rx.fullmatch(path)
            if m is None:
                continue
            route = table.get(request.method) or table.get("*")
            if route is None and request.method == "HEAD":
                route = table.get("GET")
            return m, pattern, route
        return None

    def label(self, request: Request) -> str:
        """The label ``request`` gets, or got: for requests answered before the router saw them."""
        if request.route != UNMATCHED:
            return request.route
        found = self._find(request, normalize_path(request.path))
        if found is None:
            return UNMATCHED
        _, pattern, route = found
        return route.label if route is not None else pattern

    async def __call__(self, request: Request) -> Response:
        path = request.path = request.target.path  # normalized once, with the rest of the target
        # The loop of ``_find``, inline: this runs for every request.
        for prefix, rx, pattern, table in self._routes:
            if not path.startswith(prefix):
                continue
            m = rx.fullmatch(path)
            if m is None:
                continue
            route = table.get(request.method) or table.get("*")
            if route is None and request.method == "HEAD":
                route = table.get("GET")
            if route is None:
                request.route = pattern
                allowed = ", ".join(sorted(table))
                raise TieredError(
                    ErrorCode.METHOD_NOT_ALLOWED,
                    f"method {request.method} is not allowed here",
                    allow=allowed,
                )
            request.params = m.groupdict()
            request.route = route.label
            return await route.handler(request)
        raise TieredError(ErrorCode.NOT_FOUND, "no such route")
