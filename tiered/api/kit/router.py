"""Routing: method and path pattern to what serves it, matched on the raw (still percent-encoded) path.

Patterns are literal segments and ``{name}`` (one segment) or ``{name...}``
(the rest of the path, any characters, including encoded newlines, so bad
names reach validation and a 400 rather than missing the route). Patterns are
tried in the order added; the first that matches the path wins. Its value
for the method is the request's; a ``HEAD`` no value names is served as the
``GET``; ``*`` stands for every method nothing else names.

``Patterns`` is the matching alone, over values of any type. The engine's
routes are the route table's (``tiered.api.table``): one ``RouteSpec`` per
route, classified once per request from these patterns, and dispatched by
the table's router. ``Router`` is a router of its own for the few routes
outside the table (a cluster node's health, readiness and metrics).

Every route has a label, its name in metrics (``tiered_http_requests_total``):
the pattern, unless the route names itself (stream operations share one
pattern and are labelled ``append``, ``read``...). A request no route matches
is labelled ``unmatched``. Labels never hold anything the client sent.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Generic, NamedTuple, TypeVar

from tiered.api.kit.target import normalize_path
from tiered.api.kit.types import UNMATCHED, Handler, Request, Response
from tiered.core.errors import ErrorCode, TieredError

__all__ = [
    "Entry",
    "Match",
    "Pattern",
    "Patterns",
    "Route",
    "Router",
    "no_route",
    "normalize_path",
    "not_allowed",
]

_PARAM = re.compile(r"\{(\w+)(\.\.\.)?\}")
T = TypeVar("T")


class Pattern:
    """One compiled pattern. ``literal{name...}`` (a literal, then the rest) matches without a regex."""

    __slots__ = ("text", "prefix", "_rx", "_rest")

    def __init__(self, text: str) -> None:
        self.text = text
        self.prefix = text.split("{", 1)[0]  # every path it matches starts so: most paths skip the regex
        params = list(_PARAM.finditer(text))
        self._rest: str | None = None  # the one parameter of ``literal{name...}``
        if (
            len(params) == 1
            and params[0].group(2)
            and params[0].start() == len(self.prefix)
            and params[0].end() == len(text)
        ):
            self._rest = params[0].group(1)
        out, pos = [], 0
        for m in params:
            out.append(re.escape(text[pos : m.start()]))
            out.append(f"(?P<{m.group(1)}>[\\s\\S]*)" if m.group(2) else f"(?P<{m.group(1)}>[^/]+)")
            pos = m.end()
        out.append(re.escape(text[pos:]))
        self._rx = re.compile("".join(out))

    def match(self, path: str) -> dict[str, str] | None:
        """The parameters of ``path`` (still percent-encoded), or None when it does not match."""
        if not path.startswith(self.prefix):
            return None
        if self._rest is not None:
            return {self._rest: path[len(self.prefix) :]}
        m = self._rx.fullmatch(path)
        return None if m is None else m.groupdict()


class Entry(Generic[T]):
    """One pattern and its values by method."""

    __slots__ = ("pattern", "values", "methods")

    def __init__(self, pattern: Pattern) -> None:
        self.pattern = pattern
        self.values: dict[str, T] = {}
        self.methods: tuple[str, ...] = ()  # the methods it names (``*`` aside), sorted: a 405's ``Allow``


#: What ``Patterns.match`` found: the value for the method (None: no value names it), the
#: parameters, the pattern's entry. A plain tuple: it is built for every request.
Match = tuple[T | None, dict[str, str], Entry[T]]


class Patterns(Generic[T]):
    """Patterns in the order added, each with its values by method."""

    def __init__(self) -> None:
        self._entries: list[Entry[T]] = []
        self._by_text: dict[str, Entry[T]] = {}

    def add(self, methods: Iterable[str], pattern: str, value: T) -> None:
        """``methods``: each method ``value`` serves, or ``*`` for every method no other value names."""
        entry = self._by_text.get(pattern)
        if entry is None:
            entry = self._by_text[pattern] = Entry(Pattern(pattern))
            self._entries.append(entry)
        for method in methods:
            if method in entry.values:
                raise ValueError(f"{method} {pattern} is routed twice")
            entry.values[method] = value
        entry.methods = tuple(sorted(m for m in entry.values if m != "*"))

    def match(self, method: str, path: str) -> tuple[T | None, dict[str, str], Entry[T]] | None:
        """The first pattern ``path`` (normalized, still percent-encoded) matches; None: none does."""
        for entry in self._entries:
            params = entry.pattern.match(path)
            if params is None:
                continue
            values = entry.values
            value = values.get(method)
            if value is None:
                if method == "HEAD":
                    value = values.get("GET")
                if value is None:
                    value = values.get("*")
            return value, params, entry
        return None


def not_allowed(method: str, methods: tuple[str, ...]) -> TieredError:
    """The router's 405: ``Allow`` lists the methods the matched pattern names (``Match.methods``)."""
    return TieredError(
        ErrorCode.METHOD_NOT_ALLOWED, f"method {method} is not allowed here", allow=", ".join(methods)
    )


def no_route() -> TieredError:
    return TieredError(ErrorCode.NOT_FOUND, "no such route")


class Route(NamedTuple):
    handler: Handler
    label: str


class Router:
    """Routes added one by one (``add``): for handlers outside the route table."""

    def __init__(self) -> None:
        self._patterns: Patterns[Route] = Patterns()

    def add(self, methods: str, pattern: str, handler: Handler, *, label: str | None = None) -> None:
        """``methods``: space-separated, or ``*`` for any (the handler then checks).

        ``label``: the route's name in metrics (default: ``pattern``).
        """
        self._patterns.add(methods.split(), pattern, Route(handler, label or pattern))

    def label(self, request: Request) -> str:
        """The label ``request`` gets, or got: for requests answered before the router saw them."""
        if request.route != UNMATCHED:
            return request.route
        found = self._patterns.match(request.method, normalize_path(request.path))
        if found is None:
            return UNMATCHED
        route, _, entry = found
        return route.label if route is not None else entry.pattern.text

    async def __call__(self, request: Request) -> Response:
        path = request.path = request.target.path  # normalized once, with the rest of the target
        found = self._patterns.match(request.method, path)
        if found is None:
            raise no_route()
        route, params, entry = found
        if route is None:
            request.route = entry.pattern.text
            raise not_allowed(request.method, entry.methods)
        request.params = params
        request.route = route.label
        return await route.handler(request)
