"""HTTP API of consumer groups (our extension of the protocol), under ``/v1/groups``.

| route | what |
| --- | --- |
| ``GET /v1/groups`` | list groups |
| ``PUT /v1/groups/{group}`` | create (201) or re-confirm an identical one (200) |
| ``GET /v1/groups/{group}`` | configuration, members, every stream's owner, holder, fence, cursor, tail |
| ``DELETE /v1/groups/{group}`` | retire the incarnation (204) |
| ``POST /v1/groups/{group}/join`` | join as an instance of a member id |
| ``POST /v1/groups/{group}/heartbeat`` | commit, release, stay alive; returns the assignment (long-poll) |
| ``POST /v1/groups/{group}/leave`` | final commits and leave |
| ``POST /v1/groups/{group}/streams`` | link explicit streams |
| ``DELETE /v1/groups/{group}/streams/{path}`` | unlink an explicit stream |

Errors are ``{"error": {"code": ..., "message": ..., ...}}`` (the shape the
protocol uses for subscription errors). See README "Consumer groups".
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import unquote

import msgspec
from aiohttp import web

from .group_service import MAX_WAIT_MS, GroupCoordinator
from .groups import (
    DEFAULT_MAX_MEMBERS,
    DEFAULT_MAX_STREAMS,
    DEFAULT_SESSION_TIMEOUT_MS,
    CommitRequest,
    GroupError,
    GroupSpec,
    Rejected,
    ReleaseRequest,
    bad_request,
    validate_group_name,
)
from .ids import DEFAULT_BUCKET, parse_offset
from .service import StreamService, now_ms

GROUPS_PREFIX = "/v1/groups"

NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class CreateBody(msgspec.Struct, forbid_unknown_fields=True):
    pattern: str | None = None
    streams: list[str] = []
    bucket: str = DEFAULT_BUCKET
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    max_members: int = DEFAULT_MAX_MEMBERS
    max_streams: int = DEFAULT_MAX_STREAMS


class JoinBody(msgspec.Struct, forbid_unknown_fields=True):
    member: str
    join_id: str


class CommitItem(msgspec.Struct, forbid_unknown_fields=True):
    stream: str
    fence: NonNegative
    offset: str


class ReleaseItem(msgspec.Struct, forbid_unknown_fields=True):
    stream: str
    fence: NonNegative


class HeartbeatBody(msgspec.Struct, forbid_unknown_fields=True):
    member: str
    incarnation: NonNegative
    generation: NonNegative
    revision: NonNegative | None = None  # the revision the member last saw; with wait_ms, park while unchanged
    wait_ms: NonNegative = 0
    commits: list[CommitItem] = []
    releases: list[ReleaseItem] = []
    op_id: str | None = None


class LeaveBody(msgspec.Struct, forbid_unknown_fields=True):
    member: str
    incarnation: NonNegative
    generation: NonNegative
    commits: list[CommitItem] = []


class LinkBody(msgspec.Struct, forbid_unknown_fields=True):
    streams: list[str]
    incarnation: NonNegative | None = None
    revision: NonNegative | None = None
    op_id: str | None = None


def group_error_response(exc: GroupError) -> web.Response:
    headers = {"Retry-After": "5"} if exc.status == 503 else None
    return web.Response(
        status=exc.status, body=msgspec.json.encode(exc.body()), content_type="application/json", headers=headers
    )


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, body=msgspec.json.encode(data), content_type="application/json")


async def _body(request: web.Request, kind: type[Any]) -> Any:
    raw = await request.read()
    try:
        return msgspec.json.decode(raw, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise bad_request(f"invalid request body: {exc}") from None


def _query_int(request: web.Request, name: str) -> int | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    if not raw.isdigit() or len(raw) > 18:
        raise bad_request(f"query parameter {name} must be a non-negative integer")
    return int(raw)


def _commits(items: list[CommitItem]) -> list[CommitRequest]:
    out = []
    for c in items:
        offset = parse_offset(c.offset)
        if offset is None:
            raise bad_request(f"malformed offset {c.offset!r} for stream {c.stream!r}")
        out.append(CommitRequest(c.stream, c.fence, offset))
    return out


def _rejected(items: list[Rejected]) -> list[dict[str, str]]:
    return [{"stream": r.stream, "code": r.code, "message": r.message} for r in items]


def _handler(fn):  # type: ignore[no-untyped-def]
    async def wrapped(self: GroupsApi, request: web.Request) -> web.StreamResponse:
        try:
            name = validate_group_name(request.match_info["group"]) if "group" in request.match_info else ""
            return await fn(self, request, name)
        except GroupError as exc:
            return group_error_response(exc)

    wrapped.__name__ = fn.__name__
    return wrapped


class GroupsApi:
    def __init__(self, service: StreamService) -> None:
        self.service = service
        self.groups = GroupCoordinator(service)

    def routes(self) -> list[web.RouteDef]:
        p = GROUPS_PREFIX
        return [
            web.get(p, self.list_groups),
            web.put(p + "/{group}", self.create),
            web.get(p + "/{group}", self.describe),
            web.delete(p + "/{group}", self.delete),
            web.post(p + "/{group}/join", self.join),
            web.post(p + "/{group}/heartbeat", self.heartbeat),
            web.post(p + "/{group}/leave", self.leave),
            web.post(p + "/{group}/streams", self.link),
            web.delete(p + "/{group}/streams/{path:[\\s\\S]+}", self.unlink),
        ]

    def install(self, app: web.Application) -> None:
        """Add the routes and run the sweeper while the app runs."""
        app.add_routes(self.routes())
        app.on_startup.append(self._on_startup)
        app.on_cleanup.append(self._on_cleanup)

    async def _on_startup(self, app: web.Application) -> None:
        self.groups.start()

    async def _on_cleanup(self, app: web.Application) -> None:
        await self.groups.stop()

    def _view(self, name: str) -> dict[str, Any]:
        return self.groups.core.group_view(name, self.service.state, now_ms(), lambda s: self.service.view(s).tail)

    # ---------------------------------------------------------------- admin

    async def list_groups(self, request: web.Request) -> web.StreamResponse:
        summary = self.groups.core.summary()
        try:
            await self.groups.settled()
        except GroupError as exc:
            return group_error_response(exc)
        return _json({"groups": summary})

    @_handler
    async def create(self, request: web.Request, name: str) -> web.StreamResponse:
        b = await _body(request, CreateBody)
        spec = GroupSpec(b.bucket, b.pattern, tuple(b.streams), b.session_timeout_ms, b.max_members, b.max_streams)
        records = self.groups.core.decide_create(name, spec, self.service.state, now_ms())
        await self.groups.commit(records)
        view = self._view(name)
        await self.groups.settled()  # an identical create may still be on its way to disk
        return _json(view, 201 if records else 200)

    @_handler
    async def describe(self, request: web.Request, name: str) -> web.StreamResponse:
        view = self._view(name)
        await self.groups.settled()
        return _json(view)

    @_handler
    async def delete(self, request: web.Request, name: str) -> web.StreamResponse:
        incarnation = _query_int(request, "incarnation")
        revision = _query_int(request, "revision")
        records = self.groups.core.decide_delete(name, now_ms(), incarnation=incarnation, expected_revision=revision)
        await self.groups.commit(records)
        await self.groups.settled()
        return web.Response(status=204)

    @_handler
    async def link(self, request: web.Request, name: str) -> web.StreamResponse:
        b = await _body(request, LinkBody)
        records = self.groups.core.decide_link(
            name, b.streams, self.service.state, now_ms(),
            incarnation=b.incarnation, expected_revision=b.revision, op_id=b.op_id,
        )
        await self.groups.commit(records)
        view = self._view(name)
        await self.groups.settled()
        return _json(view)

    @_handler
    async def unlink(self, request: web.Request, name: str) -> web.StreamResponse:
        raw = request.raw_path.split("?", 1)[0]
        marker = f"{GROUPS_PREFIX}/{name}/streams/"
        if not raw.startswith(marker):
            raise bad_request("not a group stream URL")
        try:
            path = unquote(raw[len(marker) :], errors="strict")
        except UnicodeDecodeError:
            raise bad_request("the stream path is not valid UTF-8 once percent-decoded") from None
        records = self.groups.core.decide_link(
            name, [path], self.service.state, now_ms(), unlink=True,
            incarnation=_query_int(request, "incarnation"), expected_revision=_query_int(request, "revision"),
            op_id=request.query.get("op_id"),
        )
        await self.groups.commit(records)
        view = self._view(name)
        await self.groups.settled()
        return _json(view)

    # ---------------------------------------------------------------- members

    @_handler
    async def join(self, request: web.Request, name: str) -> web.StreamResponse:
        b = await _body(request, JoinBody)
        core = self.groups.core
        records = core.decide_join(name, b.member, b.join_id, self.service.state, now_ms())
        await self.groups.commit(records)
        view = core.member_view(name, b.member)
        await self.groups.settled()
        return _json(view)

    @_handler
    async def heartbeat(self, request: web.Request, name: str) -> web.StreamResponse:
        b = await _body(request, HeartbeatBody)
        commits = _commits(b.commits)
        releases = [ReleaseRequest(r.stream, r.fence) for r in b.releases]
        core = self.groups.core
        now = now_ms()
        records, rejected = core.decide_heartbeat(
            name, b.incarnation, b.member, b.generation, commits, releases, self.service.state, now, op=b.op_id
        )
        core.touch(name, b.incarnation, b.member, b.generation, now)
        await self.groups.commit(records)
        if b.wait_ms and b.revision is not None and not rejected:
            g = core.get(name)
            wait_ms = min(b.wait_ms, MAX_WAIT_MS, g.spec.session_timeout_ms // 2)
            await self.groups.wait_for_change(name, b.incarnation, b.revision, wait_ms / 1000)
            core = self.groups.core
            g = core.check_group(name, b.incarnation)  # the wait may have seen it fenced or deleted
            core.check_member(g, b.member, b.generation)
            core.touch(name, b.incarnation, b.member, b.generation, now_ms())
        view = core.member_view(name, b.member)
        view["rejected"] = _rejected(rejected)
        await self.groups.settled()
        return _json(view)

    @_handler
    async def leave(self, request: web.Request, name: str) -> web.StreamResponse:
        b = await _body(request, LeaveBody)
        commits = _commits(b.commits)
        records, rejected, was_member = self.groups.core.decide_leave(
            name, b.incarnation, b.member, b.generation, commits, self.service.state, now_ms()
        )
        await self.groups.commit(records)
        await self.groups.settled()
        return _json({"group": name, "member": b.member, "left": was_member, "rejected": _rejected(rejected)})
