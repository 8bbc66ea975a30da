"""The route table: every route of an engine, one ``RouteSpec`` each, and everything derived from it.

A request is classified once (``route_of``): its target parsed
(``tiered.api.kit.target``) and matched against the table (a pure function of
the method and path), the result kept on the request. Every layer then reads
that one value:

* the access check (``tiered.api.access``) judges the row's ``scope``, and
  counts the row's ``usage`` class;
* the router (``TableRouter``) calls the row's ``handler``, bound once per
  engine (``bind``), behind the admin guard when the scope is the operator's,
  and names the request ``label`` in metrics;
* in cluster mode, shard routing (``tiered.cluster.gateway.shard_router``)
  keys the request by the row's ``shard`` rule (``tiered.cluster.gateway.routing``)
  and sends it where the row's ``fanout`` says: one shard, every shard merged
  by the row's ``scatter`` plan (``tiered.cluster.gateway.scatter``), every
  shard as a bucket-wide write, or this node.

A new endpoint is one row here and its handler in its feature's routes
(``tiered/api/routes/``). ``tests/api/test_route_table.py`` checks that every
row has every field and that the router, the access check and cluster routing
agree with the table for generated requests of every family.

Rows are tried in order, within the target's family; a pattern's ``*`` row
serves every method its other rows do not name (a 405, from the router or the
feature), so every request a pattern matches has a row. A request that names
a family but no route (``/v1/admin/nothing``) gets an *unrouted* spec
(``UNROUTED``): no handler (the router's 404, labelled ``unmatched``), and the
scope of its family, so that a caller without a grant learns no more from a
wrong URL than from a missing thing.

The scope, as the access check applies it:

| ``kind`` | who may |
| --- | --- |
| ``OPEN`` | anyone (health, the webhook JWKS) |
| ``OPERATOR`` | the route's admin guard checks the operator's admin token (``bind`` puts it there) |
| ``SELF`` | the route checks a token of its own (a subscription's wake token) |
| ``ANY`` | any valid credential; the answer lists only what it may see |
| ``BUCKET`` | a grant of ``level`` on the bucket ``where`` names; ``stream``: a grant's prefix must cover the stream; ``whole_bucket``: only a grant without a prefix; ``public``: a public-read bucket admits anyone |
| ``BODY`` | as ``BUCKET`` with ``ADMIN``, on the bucket the body names (a group's creation) |

``missing`` is what the route answers when the thing does not exist: what a
caller without a grant gets (404), so names do not leak.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Literal, NamedTuple

from tiered.api.kit.router import Patterns, no_route, normalize_path, not_allowed
from tiered.api.kit.target import BUCKETS_PREFIX, STREAM_PREFIX, Family, Target
from tiered.api.kit.types import UNMATCHED, Handler, Middleware, Request, Response
from tiered.core.errors import TieredError
from tiered.core.ids import DEFAULT_BUCKET
from tiered.engine.auth.credentials import Level

if TYPE_CHECKING:
    from tiered.api.routes.admin import AdminRoutes
    from tiered.api.routes.auth import AuthRoutes
    from tiered.api.routes.buckets import BucketRoutes
    from tiered.api.routes.groups import GroupRoutes
    from tiered.api.routes.streams import StreamRoutes
    from tiered.api.routes.subscriptions import SubscriptionRoutes
    from tiered.api.routes.tenants import TenantRoutes

__all__ = [
    "ROUTES",
    "SUBSCRIPTIONS_KEY",
    "UNROUTED",
    "Fanout",
    "Features",
    "Kind",
    "Missing",
    "RouteSpec",
    "Routed",
    "Scope",
    "Shard",
    "TableRouter",
    "Where",
    "bind",
    "classify",
    "route_by_path",
    "route_of",
    "shard_key",
]


class Kind(Enum):
    OPEN = "open"  # anyone
    OPERATOR = "operator"  # the route checks the admin token itself
    SELF = "self"  # the route checks a token of its own (subscription wakes)
    ANY = "any"  # any valid credential; the answer shows only what it may see
    BUCKET = "bucket"  # a scope on a bucket
    BODY = "body"  # a scope on the bucket the body names (``resolve``, once the caller is known)


class Where(Enum):
    """Whose bucket a ``BUCKET`` scope is on."""

    TARGET = "target"  # the bucket the target names
    DEFAULT = "default"  # the default bucket (the subscription APIs live there)
    GROUP = "group"  # the named group's (no such group: ``ANY``, and the route answers 404)


class Missing(Enum):
    """The route's own answer for "no such thing" (``tiered.api.access`` builds the error)."""

    NONE = "none"
    STREAM = "stream"
    BUCKET = "bucket"
    SUBSCRIPTION = "subscription"
    GROUP = "group"


@dataclass(frozen=True, slots=True)
class Scope:
    """What a request needs (see the module docstring's table)."""

    kind: Kind
    level: Level = Level.READ
    where: Where = Where.TARGET
    stream: bool = False
    whole_bucket: bool = False
    public: bool = False
    missing: Missing = Missing.NONE


#: The usage class a request is counted in (``tiered_bucket_requests_total``); ``read`` is ``live``
#: for a live read (``Target.live``). None: not counted.
Usage = Literal["append", "read", "admin"] | None


class Shard(Enum):
    """The shard key's rule: from what the target names, never from the method (``shard_key``)."""

    NAMED = "named"  # (bucket, stream or "") of the target; naming no bucket: the node's own
    GROUP = "group"  # (default, "__groups/" + group)
    SUBSCRIPTIONS = "subscriptions"  # (default, "__ds"): the subscriptions' one well-known shard
    NODE = "node"  # no shard: the node's own


class Fanout(Enum):
    """Where cluster mode sends a request the row serves (its methods; a ``HEAD`` served as ``GET`` is ``SHARD``)."""

    SHARD = "shard"  # the shard of its key (the node's own when it has none)
    SCATTER = "scatter"  # every shard, the answers merged by the plan ``RouteSpec.scatter`` names
    BUCKET_WIDE = "bucket-wide"  # every shard (each must know it), answered by the bucket's well-known shard
    NODE = "node"  # this node, whatever the key (health, metrics, issued tokens)


@dataclass(frozen=True, slots=True)
class Features:
    """One engine's route handlers, by feature (``tiered/api/routes/``): what ``RouteSpec.handler`` binds."""

    streams: StreamRoutes
    subscriptions: SubscriptionRoutes
    buckets: BucketRoutes
    groups: GroupRoutes
    admin: AdminRoutes
    auth: AuthRoutes
    tenants: TenantRoutes


@dataclass(frozen=True, slots=True, eq=False)  # compared and hashed by identity: the router's key
class RouteSpec:
    """One route: everything every layer needs to know about it."""

    family: Family  # the target family its pattern's paths parse to
    methods: tuple[str, ...]  # the methods it serves; ``*``: every method the pattern's other rows do not
    pattern: str | None  # ``tiered.api.kit.router`` syntax; None: an unrouted spec
    # ``feature.attribute`` of ``Features`` (bound by ``bind``); None: the router's 405, or 404 when unrouted.
    handler: str | None
    scope: Scope
    usage: Usage
    shard: Shard
    fanout: Fanout
    scatter: str | None  # the merge of a ``SCATTER`` row (``tiered.cluster.gateway.scatter``)
    label: str  # its name in metrics


class Routed(NamedTuple):
    """A request, classified: its row and the pattern's parameters (read-only)."""

    spec: RouteSpec
    params: Mapping[str, str]


# ----------------------------------------------------------------- scopes

OPEN = Scope(Kind.OPEN)
OPERATOR = Scope(Kind.OPERATOR)
SELF = Scope(Kind.SELF)
ANY = Scope(Kind.ANY)
_READ, _WRITE, _ADMIN = Level.READ, Level.WRITE, Level.ADMIN
STREAM_READ = Scope(Kind.BUCKET, _READ, stream=True, public=True, missing=Missing.STREAM)
STREAM_WRITE = Scope(Kind.BUCKET, _WRITE, stream=True, missing=Missing.STREAM)
STREAM_CREATE = Scope(Kind.BUCKET, _WRITE, stream=True, missing=Missing.BUCKET)
STREAM_OTHER = Scope(Kind.BUCKET, _READ, stream=True, missing=Missing.STREAM)  # the route answers 405
BUCKET_DESCRIBE = Scope(Kind.BUCKET, _READ, public=True, missing=Missing.BUCKET)
BUCKET_ADMIN = Scope(Kind.BUCKET, _ADMIN, whole_bucket=True, missing=Missing.BUCKET)
BUCKET_OTHER = Scope(Kind.BUCKET, _READ, missing=Missing.BUCKET)  # the router answers 405
SUB_READ = Scope(Kind.BUCKET, _READ, Where.DEFAULT, whole_bucket=True, missing=Missing.SUBSCRIPTION)
SUB_ADMIN = Scope(Kind.BUCKET, _ADMIN, Where.DEFAULT, whole_bucket=True, missing=Missing.SUBSCRIPTION)
GROUP_READ = Scope(Kind.BUCKET, _READ, Where.GROUP, whole_bucket=True, missing=Missing.GROUP)
GROUP_ADMIN = Scope(Kind.BUCKET, _ADMIN, Where.GROUP, whole_bucket=True, missing=Missing.GROUP)
GROUP_CREATE = Scope(Kind.BODY, _ADMIN, whole_bucket=True, missing=Missing.BUCKET)
# Issue 22: any grant on the bucket may list it; the answer shows only the streams its prefixes cover.
STREAM_LIST = Scope(Kind.BUCKET, _READ, public=True, missing=Missing.BUCKET)


# ----------------------------------------------------------------- the table


def _r(
    family: Family,
    methods: str,
    pattern: str,
    handler: str | None,
    scope: Scope,
    usage: Usage,
    shard: Shard,
    fanout: Fanout = Fanout.SHARD,
    scatter: str | None = None,
    *,
    label: str | None = None,
) -> RouteSpec:
    return RouteSpec(
        family,
        tuple(methods.split()),
        pattern,
        handler,
        scope,
        usage,
        shard,
        fanout,
        scatter,
        label or pattern,
    )


# Shorthands for the table below.
F = Family
NAMED, GROUP, SUBS, NODE = Shard.NAMED, Shard.GROUP, Shard.SUBSCRIPTIONS, Shard.NODE
SHARD, SCATTER, WIDE, HERE = Fanout.SHARD, Fanout.SCATTER, Fanout.BUCKET_WIDE, Fanout.NODE
DS = "/v1/stream/__ds/{tail...}"  # the subscription APIs' one label, as when one route served the prefix

#: Every route, in the order they are tried (within the target's family). ``handler``: ``feature.attribute``
#: of ``Features``; None: the router's 405. A ``*`` row: every method the pattern's other rows do not name.
# fmt: off
ROUTES: tuple[RouteSpec, ...] = (
    # Subscriptions (protocol sections 6 and 7): __ds is never an application stream.
    # family          methods     pattern                                            handler                             scope            usage     shard  fanout  scatter
    _r(F.JWKS,         "GET HEAD", "/v1/stream/__ds/jwks.json",                       "subscriptions.serve_jwks",          OPEN,            None,     SUBS, label=DS),
    _r(F.JWKS,         "*",        "/v1/stream/__ds/jwks.json",                       "subscriptions.jwks_not_allowed",    OPEN,            None,     SUBS, label=DS),
    _r(F.SUBSCRIPTION, "PUT",      "/v1/stream/__ds/subscriptions/{id}",              "subscriptions.serve_put",           SUB_ADMIN,       "admin",  SUBS, label=DS),
    _r(F.SUBSCRIPTION, "GET HEAD", "/v1/stream/__ds/subscriptions/{id}",              "subscriptions.serve_get",           SUB_READ,        "admin",  SUBS, label=DS),
    _r(F.SUBSCRIPTION, "DELETE",   "/v1/stream/__ds/subscriptions/{id}",              "subscriptions.serve_delete",        SUB_ADMIN,       "admin",  SUBS, label=DS),
    _r(F.SUBSCRIPTION, "*",        "/v1/stream/__ds/subscriptions/{id}",              "subscriptions.not_allowed",         SUB_ADMIN,       "admin",  SUBS, label=DS),
    _r(F.SUBSCRIPTION, "POST",     "/v1/stream/__ds/subscriptions/{id}/streams",      "subscriptions.serve_add_streams",   SUB_ADMIN,       "admin",  SUBS, label=DS),
    _r(F.SUBSCRIPTION, "*",        "/v1/stream/__ds/subscriptions/{id}/streams",      "subscriptions.only_post",           SUB_ADMIN,       "admin",  SUBS, label=DS),
    _r(F.SUBSCRIPTION, "DELETE",   "/v1/stream/__ds/subscriptions/{id}/streams/{path...}", "subscriptions.serve_remove_stream", SUB_ADMIN, "admin", SUBS, label=DS),
    _r(F.SUBSCRIPTION, "*",        "/v1/stream/__ds/subscriptions/{id}/streams/{path...}", "subscriptions.only_delete",     SUB_ADMIN,       "admin",  SUBS, label=DS),
    _r(F.SUBSCRIPTION, "POST",     "/v1/stream/__ds/subscriptions/{id}/callback",     "subscriptions.serve_callback",      SELF,            None,     SUBS, label=DS),
    _r(F.SUBSCRIPTION, "*",        "/v1/stream/__ds/subscriptions/{id}/callback",     "subscriptions.only_post",           SELF,            None,     SUBS, label=DS),
    _r(F.SUBSCRIPTION, "POST",     "/v1/stream/__ds/subscriptions/{id}/ack",          "subscriptions.serve_ack",           SELF,            None,     SUBS, label=DS),
    _r(F.SUBSCRIPTION, "*",        "/v1/stream/__ds/subscriptions/{id}/ack",          "subscriptions.only_post",           SELF,            None,     SUBS, label=DS),
    _r(F.SUBSCRIPTION, "POST",     "/v1/stream/__ds/subscriptions/{id}/release",      "subscriptions.serve_release",       SELF,            None,     SUBS, label=DS),
    _r(F.SUBSCRIPTION, "*",        "/v1/stream/__ds/subscriptions/{id}/release",      "subscriptions.only_post",           SELF,            None,     SUBS, label=DS),
    _r(F.SUBSCRIPTION, "POST",     "/v1/stream/__ds/subscriptions/{id}/claim",        "subscriptions.serve_claim",         SUB_READ,        "admin",  SUBS, label=DS),
    _r(F.SUBSCRIPTION, "*",        "/v1/stream/__ds/subscriptions/{id}/claim",        "subscriptions.only_post",           SUB_READ,        "admin",  SUBS, label=DS),
    _r(F.SUBSCRIPTION, "*",        "/v1/stream/__ds/subscriptions/{id}/{tail...}",    "subscriptions.no_such_action",      SUB_ADMIN,       "admin",  SUBS, label=DS),
    _r(F.CONTROL,      "GET HEAD", "/v1/stream/__ds",                                 "subscriptions.not_found",           SUB_READ,        "admin",  SUBS),
    _r(F.CONTROL,      "*",        "/v1/stream/__ds",                                 "subscriptions.not_found",           SUB_ADMIN,       "admin",  SUBS),
    _r(F.CONTROL,      "GET HEAD", "/v1/stream/__ds/{tail...}",                       "subscriptions.not_found",           SUB_READ,        "admin",  SUBS),
    _r(F.CONTROL,      "*",        "/v1/stream/__ds/{tail...}",                       "subscriptions.not_found",           SUB_ADMIN,       "admin",  SUBS),
    # Streams (the Durable Streams protocol): the hottest routes. One label per operation, whichever bucket.
    _r(F.STREAM,       "POST",     "/v1/stream/{path...}",                            "streams.serve_append",              STREAM_WRITE,    "append", NAMED, label="append"),
    _r(F.STREAM,       "GET",      "/v1/stream/{path...}",                            "streams.serve_read",                STREAM_READ,     "read",   NAMED, label="read"),
    _r(F.STREAM,       "HEAD",     "/v1/stream/{path...}",                            "streams.serve_head",                STREAM_READ,     "read",   NAMED, label="head"),
    _r(F.STREAM,       "PUT",      "/v1/stream/{path...}",                            "streams.serve_create",              STREAM_CREATE,   "append", NAMED, label="create"),
    _r(F.STREAM,       "DELETE",   "/v1/stream/{path...}",                            "streams.serve_delete",              STREAM_WRITE,    "admin",  NAMED, label="delete"),
    _r(F.STREAM,       "*",        "/v1/stream/{path...}",                            "streams.not_allowed",               STREAM_OTHER,    None,     NAMED),
    _r(F.STREAM,       "POST",     "/v1/buckets/{bucket}/stream/{path...}",           "streams.serve_append",              STREAM_WRITE,    "append", NAMED, label="append"),
    _r(F.STREAM,       "GET",      "/v1/buckets/{bucket}/stream/{path...}",           "streams.serve_read",                STREAM_READ,     "read",   NAMED, label="read"),
    _r(F.STREAM,       "HEAD",     "/v1/buckets/{bucket}/stream/{path...}",           "streams.serve_head",                STREAM_READ,     "read",   NAMED, label="head"),
    _r(F.STREAM,       "PUT",      "/v1/buckets/{bucket}/stream/{path...}",           "streams.serve_create",              STREAM_CREATE,   "append", NAMED, label="create"),
    _r(F.STREAM,       "DELETE",   "/v1/buckets/{bucket}/stream/{path...}",           "streams.serve_delete",              STREAM_WRITE,    "admin",  NAMED, label="delete"),
    _r(F.STREAM,       "*",        "/v1/buckets/{bucket}/stream/{path...}",           "streams.not_allowed",               STREAM_OTHER,    None,     NAMED),
    # Buckets.
    _r(F.BUCKETS,      "GET",      "/v1/buckets",                                     "buckets.list",                      ANY,             None,     NODE,  SCATTER, "buckets"),
    _r(F.BUCKETS,      "*",        "/v1/buckets",                                     None,                                ANY,             None,     NODE,  HERE),
    _r(F.BUCKET,       "PUT",      "/v1/buckets/{bucket}",                            "buckets.create",                    BUCKET_ADMIN,    "admin",  NAMED, WIDE),
    _r(F.BUCKET,       "GET",      "/v1/buckets/{bucket}",                            "buckets.describe",                  BUCKET_DESCRIBE, "admin",  NAMED, SCATTER, "describe"),
    _r(F.BUCKET,       "DELETE",   "/v1/buckets/{bucket}",                            "buckets.erase",                     OPERATOR,        None,     NAMED, WIDE),
    _r(F.BUCKET,       "*",        "/v1/buckets/{bucket}",                            None,                                BUCKET_OTHER,    "admin",  NAMED),
    # Issue 22: a bucket's streams, listed (``tiered.engine.streams.listing``); the default bucket's at /v1/stream.
    _r(F.STREAMS,      "GET",      "/v1/buckets/{bucket}/streams",                    "buckets.list_streams",              STREAM_LIST,     "admin",  NAMED, SCATTER, "streams"),
    _r(F.STREAMS,      "*",        "/v1/buckets/{bucket}/streams",                    None,                                STREAM_LIST,     "admin",  NAMED),
    _r(F.STREAMS,      "GET",      "/v1/stream",                                      "buckets.list_streams",              STREAM_LIST,     "admin",  NAMED, SCATTER, "streams"),
    _r(F.STREAMS,      "*",        "/v1/stream",                                      None,                                STREAM_LIST,     "admin",  NAMED),
    # Consumer groups.
    _r(F.GROUPS,       "GET",      "/v1/groups",                                      "groups.list_groups",                ANY,             None,     NODE,  SCATTER, "groups"),
    _r(F.GROUPS,       "*",        "/v1/groups",                                      None,                                ANY,             None,     NODE,  HERE),
    _r(F.GROUP,        "PUT",      "/v1/groups/{group}",                              "groups.create",                     GROUP_CREATE,    "admin",  GROUP),
    _r(F.GROUP,        "GET",      "/v1/groups/{group}",                              "groups.describe",                   GROUP_READ,      "admin",  GROUP),
    _r(F.GROUP,        "DELETE",   "/v1/groups/{group}",                              "groups.delete",                     GROUP_ADMIN,     "admin",  GROUP),
    _r(F.GROUP,        "*",        "/v1/groups/{group}",                              None,                                GROUP_ADMIN,     "admin",  GROUP),
    _r(F.GROUP,        "POST",     "/v1/groups/{group}/join",                         "groups.join",                       GROUP_READ,      "admin",  GROUP),
    _r(F.GROUP,        "*",        "/v1/groups/{group}/join",                         None,                                GROUP_READ,      "admin",  GROUP),
    _r(F.GROUP,        "POST",     "/v1/groups/{group}/heartbeat",                    "groups.heartbeat",                  GROUP_READ,      "admin",  GROUP),
    _r(F.GROUP,        "*",        "/v1/groups/{group}/heartbeat",                    None,                                GROUP_READ,      "admin",  GROUP),
    _r(F.GROUP,        "POST",     "/v1/groups/{group}/leave",                        "groups.leave",                      GROUP_READ,      "admin",  GROUP),
    _r(F.GROUP,        "*",        "/v1/groups/{group}/leave",                        None,                                GROUP_READ,      "admin",  GROUP),
    _r(F.GROUP,        "POST",     "/v1/groups/{group}/streams",                      "groups.link",                       GROUP_ADMIN,     "admin",  GROUP),
    _r(F.GROUP,        "*",        "/v1/groups/{group}/streams",                      None,                                GROUP_ADMIN,     "admin",  GROUP),
    _r(F.GROUP,        "DELETE",   "/v1/groups/{group}/streams/{path...}",            "groups.unlink",                     GROUP_ADMIN,     "admin",  GROUP),
    _r(F.GROUP,        "*",        "/v1/groups/{group}/streams/{path...}",            None,                                GROUP_ADMIN,     "admin",  GROUP),
    # Operations: the operator's (``bind`` puts the admin guard before every OPERATOR handler), and health.
    _r(F.ADMIN,        "PUT",      "/v1/admin/retention/{bucket}",                    "admin.set_bucket_retention",        OPERATOR,        None,     NAMED, WIDE),
    _r(F.ADMIN,        "*",        "/v1/admin/retention/{bucket}",                    None,                                OPERATOR,        None,     NAMED),
    _r(F.ADMIN,        "PUT",      "/v1/admin/retention/{bucket}/{path...}",          "admin.set_stream_retention",        OPERATOR,        None,     NAMED),
    _r(F.ADMIN,        "*",        "/v1/admin/retention/{bucket}/{path...}",          None,                                OPERATOR,        None,     NAMED),
    _r(F.ADMIN,        "POST",     "/v1/admin/retain/{bucket}/{path...}",             "admin.retain",                      OPERATOR,        None,     NAMED),
    _r(F.ADMIN,        "*",        "/v1/admin/retain/{bucket}/{path...}",             None,                                OPERATOR,        None,     NAMED),
    _r(F.ADMIN,        "POST",     "/v1/admin/gc",                                    "admin.run_gc",                      OPERATOR,        None,     NAMED, SCATTER, "gc"),
    _r(F.ADMIN,        "GET",      "/v1/admin/gc",                                    "admin.gc_status",                   OPERATOR,        None,     NAMED, SCATTER, "gc-status"),
    _r(F.ADMIN,        "*",        "/v1/admin/gc",                                    None,                                OPERATOR,        None,     NAMED, HERE),
    # Erasure (issue 21): what still holds an erased bucket's bytes.
    _r(F.ADMIN,        "GET",      "/v1/admin/erasure",                               "admin.erasure",                     OPERATOR,        None,     NAMED, SCATTER, "erasure"),
    _r(F.ADMIN,        "*",        "/v1/admin/erasure",                               None,                                OPERATOR,        None,     NAMED, HERE),
    # Integrity digests (issue 22): a bucket's, with each of its streams' (not in /metrics: cardinality).
    _r(F.ADMIN,        "GET",      "/v1/admin/integrity/{bucket}",                    "admin.integrity",                   OPERATOR,        None,     NAMED, SCATTER, "integrity"),
    _r(F.ADMIN,        "*",        "/v1/admin/integrity/{bucket}",                    None,                                OPERATOR,        None,     NAMED, HERE),
    _r(F.METRICS,      "GET",      "/metrics",                                        "admin.metrics",                     OPERATOR,        None,     NODE,  HERE),
    _r(F.METRICS,      "*",        "/metrics",                                        None,                                OPERATOR,        None,     NODE,  HERE),
    _r(F.OTHER,        "GET",      "/healthz",                                        "admin.health",                      OPEN,            None,     NODE,  HERE),
    _r(F.OTHER,        "*",        "/healthz",                                        None,                                OPEN,            None,     NODE,  HERE),
    _r(F.OTHER,        "GET",      "/readyz",                                         "admin.ready",                       OPEN,            None,     NODE,  HERE),
    _r(F.OTHER,        "*",        "/readyz",                                         None,                                OPEN,            None,     NODE,  HERE),
    # Tokens: in cluster mode served by the node that got them (minted there, installed on every shard).
    _r(F.ADMIN,        "POST",     "/v1/admin/tokens",                                "auth.issue",                        OPERATOR,        None,     NAMED, HERE),
    _r(F.ADMIN,        "GET",      "/v1/admin/tokens",                                "auth.list",                         OPERATOR,        None,     NAMED, HERE),
    _r(F.ADMIN,        "*",        "/v1/admin/tokens",                                None,                                OPERATOR,        None,     NAMED, HERE),
    _r(F.ADMIN,        "GET",      "/v1/admin/tokens/{id}",                           "auth.describe",                     OPERATOR,        None,     NAMED, HERE),
    _r(F.ADMIN,        "PUT",      "/v1/admin/tokens/{id}",                           "auth.install_token",                OPERATOR,        None,     NAMED, HERE),
    _r(F.ADMIN,        "DELETE",   "/v1/admin/tokens/{id}",                           "auth.revoke",                       OPERATOR,        None,     NAMED, HERE),
    _r(F.ADMIN,        "*",        "/v1/admin/tokens/{id}",                           None,                                OPERATOR,        None,     NAMED, HERE),
    _r(F.ADMIN,        "POST",     "/v1/admin/tokens/{id}/rotate",                    "auth.rotate",                       OPERATOR,        None,     NAMED, HERE),
    _r(F.ADMIN,        "*",        "/v1/admin/tokens/{id}/rotate",                    None,                                OPERATOR,        None,     NAMED, HERE),
    # A bucket's public read, its quotas; usage.
    _r(F.ADMIN,        "GET",      "/v1/admin/access/{bucket}",                       "auth.get_access",                   OPERATOR,        None,     NAMED),
    _r(F.ADMIN,        "PUT",      "/v1/admin/access/{bucket}",                       "auth.set_access",                   OPERATOR,        None,     NAMED, WIDE),
    _r(F.ADMIN,        "*",        "/v1/admin/access/{bucket}",                       None,                                OPERATOR,        None,     NAMED),
    _r(F.ADMIN,        "GET",      "/v1/admin/quotas/{bucket}",                       "tenants.get_quotas",                OPERATOR,        None,     NAMED),
    _r(F.ADMIN,        "PUT",      "/v1/admin/quotas/{bucket}",                       "tenants.set_quotas",                OPERATOR,        None,     NAMED, WIDE),
    _r(F.ADMIN,        "*",        "/v1/admin/quotas/{bucket}",                       None,                                OPERATOR,        None,     NAMED),
    _r(F.ADMIN,        "GET",      "/v1/admin/usage",                                 "tenants.usage",                     OPERATOR,        None,     NAMED, SCATTER, "usage"),
    _r(F.ADMIN,        "*",        "/v1/admin/usage",                                 None,                                OPERATOR,        None,     NAMED, HERE),
)
# fmt: on


def _unrouted(family: Family, scope: Scope, usage: Usage, shard: Shard, fanout: Fanout) -> RouteSpec:
    return RouteSpec(family, ("*",), None, None, scope, usage, shard, fanout, None, UNMATCHED)


_ADMIN_UNROUTED = _unrouted(Family.ADMIN, OPERATOR, None, Shard.NAMED, Fanout.SHARD)
_OTHER_UNROUTED = _unrouted(Family.OTHER, OPEN, None, Shard.NODE, Fanout.NODE)
_GROUP_UNROUTED_READ = _unrouted(Family.GROUP, GROUP_READ, "admin", Shard.GROUP, Fanout.SHARD)
_GROUP_UNROUTED_ADMIN = _unrouted(Family.GROUP, GROUP_ADMIN, "admin", Shard.GROUP, Fanout.SHARD)
_GROUP_UNROUTED_CREATE = _unrouted(Family.GROUP, GROUP_CREATE, "admin", Shard.GROUP, Fanout.SHARD)
#: What a request gets that names a family but no route (every other family's paths all match a pattern).
UNROUTED: tuple[RouteSpec, ...] = (
    _ADMIN_UNROUTED,
    _OTHER_UNROUTED,
    _GROUP_UNROUTED_READ,
    _GROUP_UNROUTED_ADMIN,
    _GROUP_UNROUTED_CREATE,
)
_GROUP_READS = ("join", "heartbeat", "leave")


def _unrouted_spec(method: str, target: Target) -> RouteSpec:
    family = target.family
    if family is Family.GROUP:
        # Judged as the route its action names would be: a member's call reads, a trailing '/' is the group.
        action = target.action
        if action in _GROUP_READS:
            return _GROUP_UNROUTED_READ
        if not action and method == "PUT":
            return _GROUP_UNROUTED_CREATE
        if not action and method in ("GET", "HEAD"):
            return _GROUP_UNROUTED_READ
        return _GROUP_UNROUTED_ADMIN
    if family is Family.ADMIN:
        return _ADMIN_UNROUTED
    if family is Family.OTHER:
        return _OTHER_UNROUTED
    raise AssertionError(f"every {family.value} path matches a route")  # tests/api/test_route_table.py


def _patterns(rows: tuple[RouteSpec, ...]) -> Patterns[RouteSpec]:
    patterns: Patterns[RouteSpec] = Patterns()
    for spec in rows:
        assert spec.pattern is not None
        patterns.add(spec.methods, spec.pattern, spec)
    return patterns


_BY_FAMILY: dict[Family, Patterns[RouteSpec]] = {
    family: _patterns(tuple(r for r in ROUTES if r.family is family)) for family in Family
}
_ALL = _patterns(ROUTES)  # for labelling a request whose target does not parse: by its path alone
_NO_PARAMS: Mapping[str, str] = {}
_STREAM_AT, _BUCKET_AT = len(STREAM_PREFIX), len(BUCKETS_PREFIX)


# ----------------------------------------------------------------- classifying


def _by_method(pattern: str) -> dict[str, RouteSpec]:
    return {method: spec for spec in ROUTES if spec.pattern == pattern for method in spec.methods}


_STREAM = Family.STREAM
_DEFAULT_STREAM = _by_method("/v1/stream/{path...}")
_BUCKET_STREAM = _by_method("/v1/buckets/{bucket}/stream/{path...}")
_routed = tuple.__new__  # a Routed without NamedTuple's Python-level constructor: this runs for every request


def classify(method: str, target: Target) -> Routed:
    """The route a request to ``target`` takes (pure: the same on every node, for every layer).

    The stream routes, the hottest, are matched as their patterns would
    match them (``tests/api/test_route_table.py`` checks it), from the URL
    form the target parser told apart, without trying patterns one by one.
    """
    family = target.family
    path = target.path
    if family is _STREAM:
        if path.startswith(STREAM_PREFIX):
            rows, params = _DEFAULT_STREAM, {"path": path[_STREAM_AT:]}
        else:  # /v1/buckets/{bucket}/stream/{path...}: a bucket name has no '/'
            bucket, _, rest = path[_BUCKET_AT:].partition("/stream/")
            rows, params = _BUCKET_STREAM, {"bucket": bucket, "path": rest}
        return _routed(Routed, (rows.get(method) or rows["*"], params))
    found = _BY_FAMILY[family].match(method, path)
    if found is not None:
        spec, found_params, _ = found
        if spec is not None:
            return _routed(Routed, (spec, found_params))
    return _routed(Routed, (_unrouted_spec(method, target), _NO_PARAMS))


def route_by_path(method: str, path: str) -> RouteSpec | None:
    """The row a request to ``path`` (normalized, still percent-encoded) takes, by its pattern alone.

    For what has no parsed target: a request whose target does not parse (its
    metrics label), a path named in a test. None: no pattern matches.
    """
    found = _ALL.match(method, path)
    return None if found is None else found[0]


def route_of(request: Request) -> Routed:
    """``request`` classified: once, kept on the request (raises its 4xx if its target does not parse)."""
    routed: Routed | None = request.routed
    if routed is None:
        routed = request.routed = classify(request.method, request.target)
    return routed


def _named_key(target: Target) -> tuple[str, str] | None:
    bucket = target.bucket
    return None if bucket is None else (bucket, target.stream or "")


def _group(target: Target) -> tuple[str, str] | None:
    return DEFAULT_BUCKET, "__groups/" + (target.name or "")


SUBSCRIPTIONS_KEY = (DEFAULT_BUCKET, "__ds")


def _subscriptions(target: Target) -> tuple[str, str] | None:
    return SUBSCRIPTIONS_KEY


def _node(target: Target) -> tuple[str, str] | None:
    return None


_KEYS: dict[Shard, Callable[[Target], tuple[str, str] | None]] = {
    Shard.NAMED: _named_key,
    Shard.GROUP: _group,
    Shard.SUBSCRIPTIONS: _subscriptions,
    Shard.NODE: _node,
}
#: One rule per family (a test checks every row agrees): a stream's requests, whatever their method, meet in one shard.
_SHARD_OF_FAMILY = {spec.family: _KEYS[spec.shard] for spec in (*ROUTES, *UNROUTED)}


def shard_key(target: Target) -> tuple[str, str] | None:
    """The (bucket, name) whose shard serves a request to ``target`` (``shards.shard_of`` hashes it); None: any node."""
    return _SHARD_OF_FAMILY[target.family](target)


# ----------------------------------------------------------------- the router


def bind(features: Features, guard: Middleware) -> dict[RouteSpec, Handler]:
    """Each row's handler in one engine's ``features``; an ``OPERATOR`` row's behind the admin ``guard``."""
    handlers: dict[RouteSpec, Handler] = {}
    for spec in ROUTES:
        if spec.handler is not None:
            feature, _, name = spec.handler.partition(".")
            handler: Handler = getattr(getattr(features, feature), name)  # a missing one fails at start-up
            handlers[spec] = guard(handler) if spec.scope.kind is Kind.OPERATOR else handler
    return handlers


class TableRouter:
    """One engine's router: a request's row (``route_of``, classified once) to its bound handler.

    A ``*`` row without a handler is the router's 405 (``Allow``: the pattern's
    other rows' methods); an unrouted spec, the router's 404.
    """

    def __init__(self, handlers: Mapping[RouteSpec, Handler]) -> None:
        self._handlers = dict(handlers)

    async def __call__(self, request: Request) -> Response:
        routed: Routed | None = request.routed  # classified by the access check, as a rule
        spec, params = routed if routed is not None else route_of(request)
        handler = self._handlers.get(spec)
        request.path = request.target.path  # normalized once, with the rest of the target
        if handler is None:
            if spec.pattern is None:
                raise no_route()
            request.route = spec.label
            raise not_allowed(request.method, _allowed(spec))
        request.params = params
        request.route = spec.label
        return await handler(request)

    def label(self, request: Request) -> str:
        """The label ``request`` gets, or got: for requests answered before the router saw them (auth)."""
        if request.route != UNMATCHED:
            return request.route
        try:
            return route_of(request).spec.label
        except TieredError:  # a target that does not parse: named by its path alone, as the router would
            spec = route_by_path(request.method, normalize_path(request.path))
            return UNMATCHED if spec is None else spec.label


def _allowed(spec: RouteSpec) -> tuple[str, ...]:
    return tuple(sorted(m for r in ROUTES if r.pattern == spec.pattern for m in r.methods if m != "*"))
