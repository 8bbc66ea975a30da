"""Spellings of one request, for the encoding property tests (this module holds no tests).

A request is a ``Shape``: a method, path parts, query pairs and headers, all
decoded. ``canonical`` spells it the one plain way (``urllib.parse.quote``);
``spelled`` draws another spelling of the very same request: any character of
a name, a literal segment, a query name or value (and of the path in
``Stream-Forked-From``) percent-encoded or not, hex digits in either case, a
space in the query as ``+``. A name that holds ``%XX`` text is double
encoding: its ``%`` is always ``%25``, and the ``XX`` after it may be
escaped again. Every spelling decodes to the same request, so every layer
must decide about it exactly as about the canonical one.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from urllib.parse import quote

from hypothesis import strategies as st

UNRESERVED = frozenset(string.ascii_letters + string.digits + "-._~")
#: May appear raw in a path segment (RFC 3986 pchar); anything else is always escaped.
PATH_RAW = UNRESERVED | frozenset("!$&'()*+,;=:@")
#: May appear raw in a query name or value ('&', '=', '+', '#' and '%' are syntax there).
QUERY_RAW = UNRESERVED | frozenset("!$'()*,;:@/?")


@dataclass(frozen=True)
class Part:
    """A path part: ``text`` decoded; ``slashes``: its '/' are separators inside a name (may be %2F)."""

    text: str
    slashes: bool = False


@dataclass(frozen=True)
class Shape:
    method: str
    parts: tuple[Part, ...]
    query: tuple[tuple[str, str], ...] = ()
    fork: tuple[Part, ...] | None = None  # Stream-Forked-From, as path parts
    headers: tuple[tuple[str, str], ...] = field(default=())

    def describe(self) -> str:
        return f"{self.method} /{'/'.join(p.text for p in self.parts)} {dict(self.query)} fork={self.fork}"


def lit(*segments: str) -> tuple[Part, ...]:
    return tuple(Part(s) for s in segments)


# ----------------------------------------------------------------- the plain spelling


def _plain_path(parts: tuple[Part, ...]) -> str:
    return "/" + "/".join(quote(p.text, safe="/" if p.slashes else "") for p in parts)


def _plain_query(query: tuple[tuple[str, str], ...]) -> str:
    return "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in query)


@dataclass(frozen=True)
class Spelling:
    path: str
    query: str
    headers: dict[str, str]

    @property
    def target(self) -> str:
        return self.path + (f"?{self.query}" if self.query else "")


def canonical(shape: Shape) -> Spelling:
    headers = dict(shape.headers)
    if shape.fork is not None:
        headers["Stream-Forked-From"] = _plain_path(shape.fork)
    return Spelling(_plain_path(shape.parts), _plain_query(shape.query), headers)


# ----------------------------------------------------------------- other spellings


def _escape(draw: st.DrawFn, ch: str) -> str:
    out = []
    for byte in ch.encode("utf-8"):
        digits = f"{byte:02X}"
        out.append("%" + "".join(d.lower() if d.isalpha() and draw(st.booleans()) else d for d in digits))
    return "".join(out)


def _spell(
    draw: st.DrawFn, text: str, raw: frozenset[str], *, slashes: bool = False, plus: bool = False
) -> str:
    out = []
    for ch in text:
        if ch == "/" and slashes:
            out.append("/" if draw(st.booleans()) else _escape(draw, ch))
        elif ch == " " and plus and draw(st.booleans()):
            out.append("+")
        elif ch in raw and draw(st.booleans()):
            out.append(ch)
        else:
            out.append(_escape(draw, ch))
    return "".join(out)


def _spell_path(draw: st.DrawFn, parts: tuple[Part, ...]) -> str:
    return "/" + "/".join(_spell(draw, p.text, PATH_RAW, slashes=p.slashes) for p in parts)


@st.composite
def spelled(draw: st.DrawFn, shape: Shape) -> Spelling:
    """Another spelling of ``shape`` (sometimes the plain one)."""
    path = _spell_path(draw, shape.parts)
    query = "&".join(
        _spell(draw, k, QUERY_RAW, plus=True) + "=" + _spell(draw, v, QUERY_RAW, plus=True)
        for k, v in shape.query
    )
    headers = dict(shape.headers)
    if shape.fork is not None:
        headers["Stream-Forked-From"] = _spell_path(draw, shape.fork)
    return Spelling(path, query, headers)


#: Stream path segments that make decoding matter: escapes as text (double encoding), '%', UTF-8, spaces.
SEGMENTS = (
    "data",
    "s",
    "pct%41",
    "pct%2541",
    "%",
    "100%",
    "é",
    "a b",
    "x:y",
    "~t",
    "q?m",
    "h#t",
    "+",
    "日本",
)


def stream_paths() -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(SEGMENTS), min_size=1, max_size=3).map("/".join)
