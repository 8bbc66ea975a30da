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

Errors are ``{"error": {"code": ..., "message": ..., ...}}`` like every error
(``tiered.api.kit.errors``). Query integers go through the one integer parser.
See README "Consumer groups".
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import msgspec

from tiered.api.kit.types import Request, Response, json_response
from tiered.core.errors import bad_request
from tiered.core.ids import DEFAULT_BUCKET, parse_offset
from tiered.core.parsing import UInt, decode_body, query_uint
from tiered.engine.groups.service import GroupService
from tiered.engine.groups.state import (
    DEFAULT_MAX_MEMBERS,
    DEFAULT_MAX_STREAMS,
    DEFAULT_SESSION_TIMEOUT_MS,
    CommitRequest,
    GroupSpec,
    ReleaseRequest,
    validate_group_name,
)

GROUPS_PREFIX = "/v1/groups"


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
    fence: UInt
    offset: str


class ReleaseItem(msgspec.Struct, forbid_unknown_fields=True):
    stream: str
    fence: UInt


class HeartbeatBody(msgspec.Struct, forbid_unknown_fields=True):
    member: str
    incarnation: UInt
    generation: UInt
    revision: UInt | None = None  # the revision the member last saw; with wait_ms, park while unchanged
    wait_ms: UInt = 0
    commits: list[CommitItem] = []
    releases: list[ReleaseItem] = []
    op_id: str | None = None


class LeaveBody(msgspec.Struct, forbid_unknown_fields=True):
    member: str
    incarnation: UInt
    generation: UInt
    commits: list[CommitItem] = []


class LinkBody(msgspec.Struct, forbid_unknown_fields=True):
    streams: list[str]
    incarnation: UInt | None = None
    revision: UInt | None = None
    op_id: str | None = None


def _commits(items: list[CommitItem]) -> list[CommitRequest]:
    out = []
    for c in items:
        offset = parse_offset(c.offset)
        if offset is None:
            raise bad_request(f"malformed offset {c.offset!r} for stream {c.stream!r}")
        out.append(CommitRequest(c.stream, c.fence, offset))
    return out


def _group(request: Request) -> str:
    return validate_group_name(request.params["group"])


def _body(raw: bytes, kind: type[Any]) -> Any:
    return decode_body(raw, kind)


class GroupRoutes:
    def __init__(self, service: GroupService) -> None:
        self.service = service

    # ---------------------------------------------------------------- admin

    async def list_groups(self, request: Request) -> Response:
        groups = await self.service.list_groups()
        caller = request.auth
        if caller is not None:  # only the groups of buckets the caller may see
            groups = [g for g in groups if caller.visible(g["bucket"])]
        return json_response({"groups": groups})

    async def create(self, request: Request) -> Response:
        name = _group(request)
        b = decode_body(await request.body(), CreateBody)
        spec = GroupSpec(
            b.bucket, b.pattern, tuple(b.streams), b.session_timeout_ms, b.max_members, b.max_streams
        )
        created, view = await self.service.create(name, spec)
        return json_response(view, 201 if created else 200)

    async def describe(self, request: Request) -> Response:
        return json_response(await self.service.describe(_group(request)))

    async def delete(self, request: Request) -> Response:
        name = _group(request)
        q = request.query
        await self.service.delete(name, query_uint(q, "incarnation"), query_uint(q, "revision"))
        return Response(204)

    async def link(self, request: Request) -> Response:
        name = _group(request)
        b = decode_body(await request.body(), LinkBody)
        view = await self.service.link(
            name, b.streams, unlink=False, incarnation=b.incarnation, revision=b.revision, op_id=b.op_id
        )
        return json_response(view)

    async def unlink(self, request: Request) -> Response:
        name = _group(request)
        try:
            path = unquote(request.params["path"], errors="strict")
        except UnicodeDecodeError:
            raise bad_request("the stream path is not valid UTF-8 once percent-decoded") from None
        q = request.query
        view = await self.service.link(
            name,
            [path],
            unlink=True,
            incarnation=query_uint(q, "incarnation"),
            revision=query_uint(q, "revision"),
            op_id=q.get("op_id"),
        )
        return json_response(view)

    # ---------------------------------------------------------------- members

    async def join(self, request: Request) -> Response:
        name = _group(request)
        b = decode_body(await request.body(), JoinBody)
        return json_response(await self.service.join(name, b.member, b.join_id))

    async def heartbeat(self, request: Request) -> Response:
        name = _group(request)
        b = decode_body(await request.body(), HeartbeatBody)
        releases = [ReleaseRequest(r.stream, r.fence) for r in b.releases]
        view = await self.service.heartbeat(
            name,
            b.member,
            b.incarnation,
            b.generation,
            _commits(b.commits),
            releases,
            b.revision,
            b.wait_ms,
            b.op_id,
        )
        return json_response(view)

    async def leave(self, request: Request) -> Response:
        name = _group(request)
        b = decode_body(await request.body(), LeaveBody)
        return json_response(
            await self.service.leave(name, b.member, b.incarnation, b.generation, _commits(b.commits))
        )
