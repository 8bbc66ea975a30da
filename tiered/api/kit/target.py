"""What a request names, parsed once: every layer reads this value and none parses again (pure).

Two layers that decode the same path, query or header differently are a
hole: the access check judges one thing and the route serves another (a fork
source decoded twice, a ``li%76e=sse`` the check never saw). So the request's
target is parsed here, once, into a ``Target`` kept on the request
(``Request.target``). The route table (``tiered/api/table.py``) classifies it
once, by its family and path, into the request's route; the access check
(``tiered/api/access.py``), the stream and subscription routes, and in cluster
mode the shard key (``tiered.cluster.gateway.routing``) and the catch-up reads
answered from the store all read that value. A target that does not parse is refused here, with its
4xx, before any check runs: nothing downstream ever skips a check because
its own parse failed.

| family | path (after ``normalize_path``) | parsed |
| --- | --- | --- |
| ``STREAM`` | ``/v1/stream/{path}``, ``/v1/buckets/{bucket}/stream/{path}`` | bucket and stream (validated), ``live`` (GET), ``fork`` (PUT with ``Stream-Forked-From``) |
| ``JWKS`` | ``/v1/stream/__ds/jwks.json`` | |
| ``SUBSCRIPTION`` | ``/v1/stream/__ds/subscriptions/{id}[/{action}[/...]]`` | ``name`` (the id, decoded), ``action`` (decoded), ``rest`` (raw) |
| ``CONTROL`` | anything else under ``/v1/stream/__ds`` | |
| ``BUCKETS``, ``GROUPS`` | ``/v1/buckets``, ``/v1/groups`` | |
| ``BUCKET`` | ``/v1/buckets/{bucket}`` | bucket (validated) |
| ``STREAMS`` | ``/v1/buckets/{bucket}/streams``, ``/v1/stream`` (the default bucket) | bucket (validated) |
| ``GROUP`` | ``/v1/groups/{group}[/{action}[/...]]`` | ``name`` (validated), ``action``, ``rest`` |
| ``ADMIN`` | ``/v1/admin/...`` | retention, retain, quotas, access: bucket and stream, decoded (their routes validate them behind the operator's guard) |
| ``METRICS`` | ``/metrics`` | |
| ``OTHER`` | anything else (health, cluster internals, no such route) | |

Decoding, in one place:

* The path must be well-formed percent-encoding (every ``%`` starts an
  escape): ``pct%%30%30`` is a 400, never ``pct%00`` to one reader and
  ``pct<NUL>`` to another. Escapes of unreserved characters are decoded
  first (``normalize_path``: one URI, one spelling, as the router matches);
  names are then decoded as strict UTF-8.
* The query's names and values are percent-decoded as strict UTF-8 (the
  first of repeated names wins): ``li%76e=sse`` *is* ``live=sse``.
* ``Stream-Forked-From`` is a stream URL parsed exactly as a request path: a
  value that names no stream is ``FORK_SOURCE_NOT_FOUND`` (404).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache
from typing import Literal
from urllib.parse import parse_qsl, unquote

from tiered.core.errors import ErrorCode, TieredError, bad_request
from tiered.core.ids import DEFAULT_BUCKET, validate_bucket, validate_stream_path
from tiered.engine.groups.state import validate_group_name

__all__ = [
    "ADDRESS_CACHE_SIZE",
    "BUCKETS_PREFIX",
    "CONTROL_PREFIX",
    "FORKED_FROM",
    "RESERVED_SEGMENT",
    "STREAM_LISTING",
    "STREAM_PREFIX",
    "Family",
    "Live",
    "StreamAddress",
    "Target",
    "decode_path",
    "decode_query",
    "fork_source",
    "normalize_path",
    "parse_target",
    "stream_address",
]

STREAM_PREFIX = "/v1/stream/"
STREAM_LISTING = "/v1/stream"  # the default bucket's stream listing
BUCKETS_PREFIX = "/v1/buckets/"
GROUPS_PREFIX = "/v1/groups/"
ADMIN_PREFIX = "/v1/admin/"
RESERVED_SEGMENT = "__ds"  # the protocol's control namespace (tiered.engine.subscriptions), never a stream
CONTROL_PREFIX = STREAM_PREFIX + RESERVED_SEGMENT  # /v1/stream/__ds
FORKED_FROM = "Stream-Forked-From"
#: Admin routes naming a bucket (and, for retention and retain, a stream): their shard key.
_ADMIN_NAMED = ("retention/", "retain/", "quotas/", "access/")

#: Decoded and validated stream addresses by path: clients send the same few
#: URLs over and over, and decoding plus validating costs more than a lookup.
ADDRESS_CACHE_SIZE = 8192

Live = Literal["long-poll", "sse"]
_LIVE_MODES: dict[str, Live] = {"long-poll": "long-poll", "sse": "sse"}
StreamAddress = tuple[str, str]  # (bucket, stream path)

_UNRESERVED_ESCAPE = re.compile(r"%(2[DdEe]|3[0-9]|[46][1-9A-Fa-f]|[57][0-9Aa]|5[Ff]|7[Ee])")
_STRAY_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


class Family(Enum):
    # Hashed by identity (members are singletons): the route table looks families up for every request,
    # and Enum's own hash is a Python-level call.
    __hash__ = object.__hash__

    STREAM = "stream"
    JWKS = "jwks"
    SUBSCRIPTION = "subscription"
    CONTROL = "control"
    BUCKETS = "buckets"
    BUCKET = "bucket"
    GROUPS = "groups"
    GROUP = "group"
    ADMIN = "admin"
    METRICS = "metrics"
    OTHER = "other"
    # Issue 22: a bucket's stream listing (``GET /v1/buckets/{b}/streams``, ``GET /v1/stream``).
    STREAMS = "streams"


@dataclass(slots=True)
class Target:
    """One request's target, parsed (see the module docstring for what each family fills in).

    A value: nothing assigns to it once parsed. (Not ``frozen``: that would
    triple the cost of building one, on every request, appends included.)
    """

    family: Family
    path: str  # normalized (``normalize_path``), still percent-encoded: what the router matches
    query: Mapping[str, str]  # decoded names and values (``decode_query``)
    bucket: str | None = None
    stream: str | None = None  # the stream path (decoded); "" for an admin route naming a whole bucket
    name: str | None = None  # a group's name, a subscription's id
    action: str | None = None  # the segment after the name (``join``, ``claim``, ``streams``...)
    rest: tuple[str, ...] = ()  # raw segments after the action
    live: Live | None = None  # a live read (GET of a stream with ``live=``)
    fork: StreamAddress | None = None  # a fork's source (PUT of a stream with ``Stream-Forked-From``)


def normalize_path(path: str) -> str:
    """Decode percent-escapes of unreserved characters (RFC 3986 6.2.2.2): same URI, one spelling.

    ``/v1/stream/%5F%5Fds/...`` is ``/v1/stream/__ds/...``, so it routes the same;
    escapes of reserved characters (``%2F``, ``%3F``...) stay as they are.
    """
    if "%" not in path:
        return path
    return _UNRESERVED_ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), path)


def _well_formed(path: str) -> None:
    """Every ``%`` starts an escape: otherwise decoding after ``normalize_path`` would decode twice."""
    if "%" in path and _STRAY_PERCENT.search(path):
        raise bad_request("the path has a '%' that does not start a percent-escape (write it %25)")


def decode_path(raw: str) -> str:
    """Percent-decode strictly: invalid UTF-8 must not alias onto U+FFFD names."""
    try:
        return unquote(raw, errors="strict")
    except UnicodeDecodeError:
        raise bad_request("the path is not valid UTF-8 once percent-decoded") from None


def decode_query(query_string: str) -> dict[str, str]:
    """Query parameters, names and values percent-decoded as strict UTF-8; the first of repeated names wins."""
    query: dict[str, str] = {}
    if query_string:
        try:
            pairs = parse_qsl(query_string, keep_blank_values=True, errors="strict")
        except UnicodeDecodeError:
            raise bad_request("the query string is not valid UTF-8") from None
        for name, value in pairs:
            query.setdefault(name, value)
    return query


def stream_address(path: str) -> StreamAddress:
    """(bucket, stream path) of a decoded request path, validated; ``BAD_REQUEST`` otherwise."""
    if path.startswith(STREAM_PREFIX):
        return DEFAULT_BUCKET, _not_reserved(validate_stream_path(path[len(STREAM_PREFIX) :]))
    if path.startswith(BUCKETS_PREFIX):
        bucket, sep, tail = path[len(BUCKETS_PREFIX) :].partition("/stream/")
        if sep:
            return validate_bucket(bucket), _not_reserved(validate_stream_path(tail))
    raise bad_request("not a stream URL")


def _not_reserved(path: str) -> str:
    if path.split("/", 1)[0] == RESERVED_SEGMENT:
        raise bad_request(
            "stream paths whose first segment is __ds are reserved for Durable Streams control APIs"
        )
    return path


@lru_cache(maxsize=ADDRESS_CACHE_SIZE)
def _address(path: str) -> StreamAddress:
    """``stream_address`` of a normalized, well-formed path (a refusal raises and is never cached)."""
    return stream_address(decode_path(path))


def clean_header(value: str) -> bool:
    """Printable UTF-8 text (undecodable bytes arrive as lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return value.isprintable()


def fork_source(value: str) -> StreamAddress:
    """The stream a ``Stream-Forked-From`` value names, parsed as a request path is.

    Not printable UTF-8: 400 (as every stored header). Anything that names no
    stream (not a stream URL, a bad name, a stray ``%``): ``FORK_SOURCE_NOT_FOUND``.
    """
    if not clean_header(value):
        raise bad_request(f"{FORKED_FROM} must be printable UTF-8 text")
    path = value.split("?", 1)[0]
    try:
        _well_formed(path)
        return _address(normalize_path(path))
    except TieredError:
        raise TieredError(ErrorCode.FORK_SOURCE_NOT_FOUND, "fork source stream not found") from None


def parse_target(method: str, path: str, query: Mapping[str, str], headers: Mapping[str, str]) -> Target:
    """The target of a request (``path`` as sent, percent-encoded; ``query`` from ``decode_query``).

    Raises the request's 4xx (``TieredError``) when it does not parse.
    """
    if "%" in path:
        _well_formed(path)
        path = normalize_path(path)
    if path == STREAM_LISTING:  # no stream has an empty path, so this names none
        return Target(Family.STREAMS, path, query, bucket=DEFAULT_BUCKET)
    if path.startswith(STREAM_PREFIX):
        if path.startswith(CONTROL_PREFIX) and path[len(CONTROL_PREFIX) : len(CONTROL_PREFIX) + 1] in (
            "",
            "/",
        ):
            return _control(path, query)
        return _stream(method, path, query, headers)
    if path.startswith(BUCKETS_PREFIX):
        bucket, sep, tail = path[len(BUCKETS_PREFIX) :].partition("/")
        if sep and tail.startswith("stream/"):
            return _stream(method, path, query, headers)
        if sep and tail == "streams":
            return Target(Family.STREAMS, path, query, bucket=validate_bucket(bucket))
        if sep or not bucket:
            return Target(Family.OTHER, path, query)  # no such route
        return Target(Family.BUCKET, path, query, bucket=validate_bucket(bucket))
    if path == "/v1/buckets":
        return Target(Family.BUCKETS, path, query)
    if path == "/v1/groups":
        return Target(Family.GROUPS, path, query)
    if path.startswith(GROUPS_PREFIX):
        return _group(path, query)
    if path.startswith(ADMIN_PREFIX):
        return _admin(path, query)
    if path == "/metrics":
        return Target(Family.METRICS, path, query)
    return Target(Family.OTHER, path, query)


def _stream(method: str, path: str, query: Mapping[str, str], headers: Mapping[str, str]) -> Target:
    bucket, stream = _address(path)
    live: Live | None = None
    fork = None
    if method == "GET":
        mode = query.get("live")
        if mode is not None:
            live = _LIVE_MODES.get(mode)
            if live is None:
                raise bad_request(f"unknown live mode {mode!r}; use long-poll or sse")
    elif method == "PUT":
        source = headers.get(FORKED_FROM)
        if source is not None:
            fork = fork_source(source)
    return Target(Family.STREAM, path, query, bucket=bucket, stream=stream, live=live, fork=fork)


def _control(path: str, query: Mapping[str, str]) -> Target:
    """Under ``/v1/stream/__ds``: raw segments, as ids and stream paths may hold encoded slashes."""
    parts = path.split("/")[4:]
    first = unquote(parts[0]) if parts else ""
    if first == "jwks.json" and len(parts) == 1:
        return Target(Family.JWKS, path, query)
    if first == "subscriptions" and len(parts) > 1 and parts[1]:
        try:
            sub_id = unquote(parts[1], errors="strict")
        except UnicodeDecodeError:
            raise TieredError(ErrorCode.INVALID_REQUEST, "the subscription id is not valid UTF-8") from None
        action = unquote(parts[2]) if len(parts) > 2 else None
        rest = tuple(parts[3:])
        return Target(Family.SUBSCRIPTION, path, query, DEFAULT_BUCKET, name=sub_id, action=action, rest=rest)
    return Target(Family.CONTROL, path, query, DEFAULT_BUCKET)


def _group(path: str, query: Mapping[str, str]) -> Target:
    name, sep, tail = path[len(GROUPS_PREFIX) :].partition("/")
    if not name:
        return Target(Family.OTHER, path, query)  # no such route
    action, _, rest = tail.partition("/")
    return Target(
        Family.GROUP,
        path,
        query,
        name=validate_group_name(name),
        action=action if sep else None,
        rest=tuple(rest.split("/")) if rest else (),
    )


def _admin(path: str, query: Mapping[str, str]) -> Target:
    rest = path[len(ADMIN_PREFIX) :]
    for section in _ADMIN_NAMED:
        if rest.startswith(section):
            bucket, sep, stream = rest[len(section) :].partition("/")
            if not bucket or (sep and section in ("quotas/", "access/")):
                break  # no such route
            return Target(Family.ADMIN, path, query, bucket=_lenient(bucket), stream=_lenient(stream))
    return Target(Family.ADMIN, path, query)


def _lenient(raw: str) -> str:
    """Decoded, or as sent when it does not decode: the route refuses it (400) behind the operator's guard."""
    try:
        return unquote(raw, errors="strict")
    except UnicodeDecodeError:
        return raw
