"""Consumer groups over HTTP: every route and every error code, with exact bodies.

One ``tiered serve`` per module, then a single-node cluster of 4 shards (each group
over streams of every shard; ``tests/support/deployments.py``); each test uses its
own group and stream names.
Timestamps (``created_ms``, ``joined_ms``) are checked for shape and then
removed, so the rest of every body is compared exactly.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import deployments
from tests.support.http_helpers import Background, append, create, request, stream_url
from tests.support.server_process import ServerProcess
from tiered.cluster.membership.shards import shard_of
from tiered.core.ids import DEFAULT_BUCKET, format_offset

_n = itertools.count()
Z = format_offset(0)


@pytest.fixture(scope="module", params=deployments.SINGLE_AND_CLUSTER)
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    yield from deployments.module_server(request, "groups")


def names(prefix: str = "t") -> tuple[str, str]:
    """(group name, stream prefix) unique to one test."""
    n = next(_n)
    return f"{prefix}{n}-{time.monotonic_ns() % 10**9}", f"gs{n}-{time.monotonic_ns() % 10**9}"


def names_in_one_shard(prefix: str = "t") -> tuple[str, str]:
    """``names()`` whose stream prefix puts its ``a`` and ``b`` streams in one shard of the cluster deployment.

    Which stream moves to a new member follows stream uid order; a cluster gives
    other shards' streams uids above the group shard's own, so two streams of one
    shard keep their creation order, as on one server, and the tests' exact plans hold.
    On one server the shard is irrelevant: any unique names do.
    """
    for _ in range(1000):
        g, p = names(prefix)
        if shard_of(DEFAULT_BUCKET, f"{p}/a", deployments.CLUSTER_SHARDS) == shard_of(
            DEFAULT_BUCKET, f"{p}/b", deployments.CLUSTER_SHARDS
        ):
            return g, p
    raise AssertionError("no prefix with a and b in one shard")


def call(
    server: ServerProcess, method: str, path: str, body: Any = None, raw: bytes | None = None
) -> tuple[int, Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
    headers = {"Content-Type": "application/json"} if data else {}
    status, hdrs, out = request(method, server.url + path, headers, data, timeout=20)
    if status == 204:
        assert out == b""
        return status, None
    assert hdrs.get("Content-Type", "").startswith("application/json"), (status, out)
    return status, json.loads(out)


def strip_times(view: dict[str, Any]) -> dict[str, Any]:
    view = dict(view)
    if "created_ms" in view:
        assert isinstance(view.pop("created_ms"), int)
    if "members" in view:
        members = []
        for m in view["members"]:
            m = dict(m)
            assert isinstance(m.pop("joined_ms"), int)
            members.append(m)
        view["members"] = members
    return view


def err(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


def make_streams(server: ServerProcess, prefix: str, *names_and_data: tuple[str, bytes]) -> None:
    for name, data in names_and_data:
        status, _, _ = create(stream_url(server.url, f"{prefix}/{name}"), "text/plain", data)
        assert status == 201


def group_spec(**kw: Any) -> dict[str, Any]:
    out = {
        "bucket": "default",
        "pattern": None,
        "streams": [],
        "session_timeout_ms": 10000,
        "max_members": 64,
        "max_streams": 1024,
        "over_limit": False,
    }
    out.update(kw)
    return out


def target(
    stream: str,
    owner: str | None,
    holder: str | None,
    fence: int,
    cursor: int,
    tail: int | None,
    linked: bool = True,
) -> dict[str, Any]:
    return {
        "stream": stream,
        "linked": linked,
        "owner": owner,
        "holder": holder,
        "fence": fence,
        "cursor": format_offset(cursor),
        "tail": format_offset(tail) if tail is not None else None,
    }


def member_view(
    group: str,
    inc: int,
    rev: int,
    member: str,
    gen: int,
    assignments: list[tuple[str, int, int, bool]],
    pending: list[str] = (),
    timeout: int = 10000,
    **extra: Any,
) -> dict[str, Any]:  # type: ignore[assignment]
    return {
        "group": group,
        "incarnation": inc,
        "revision": rev,
        "member": member,
        "generation": gen,
        "bucket": "default",
        "session_timeout_ms": timeout,
        "assignments": [
            {"stream": s, "fence": f, "cursor": format_offset(c), "revoked": r} for s, f, c, r in assignments
        ],
        "pending": list(pending),
        **extra,
    }


def join(server: ServerProcess, group: str, member: str, join_id: str) -> dict[str, Any]:
    status, body = call(server, "POST", f"/v1/groups/{group}/join", {"member": member, "join_id": join_id})
    assert status == 200, body
    return body


def heartbeat(server: ServerProcess, group: str, view: dict[str, Any], **kw: Any) -> tuple[int, Any]:
    body = {
        "member": view["member"],
        "incarnation": view["incarnation"],
        "generation": view["generation"],
        **kw,
    }
    return call(server, "POST", f"/v1/groups/{group}/heartbeat", body)


def create_settled(
    server: ServerProcess, group: str, spec: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Create a group over streams that exist, then wait for the plan that makes them its targets.

    The create journals the group at revision 0 without targets (its view shows what it selects); the
    sweeper's next pass (every 0.5 s) plans those streams as owner-less targets at revision 1, unless a
    join or a link plans first. Which comes first is timing, and every later revision and fence moves
    with it; waiting for that plan makes them the same on every run: revision 1, then a first join at
    revision 2 with fence 2. Returns (the create's answer, the group as described once planned).
    """
    status, created = call(server, "PUT", f"/v1/groups/{group}", spec)
    assert status == 201, created
    deadline = time.monotonic() + 30
    while True:
        status, described = call(server, "GET", f"/v1/groups/{group}")
        assert status == 200, described
        if described["revision"] >= 1:
            assert described["revision"] == 1 and not described["members"], described
            return created, described
        assert time.monotonic() < deadline, f"the sweeper never planned the new group: {described}"
        time.sleep(0.05)


# --------------------------------------------------------------------------- create, describe, list, delete


def test_create_describe_list_delete_recreate(server: ServerProcess) -> None:
    g, p = names()
    make_streams(server, p, ("a", b"hello"), ("b", b""))
    created, body = create_settled(server, g, {"pattern": f"{p}/*", "streams": [f"{p}/later"]})
    inc = created["incarnation"]
    expected = {
        "group": g,
        "incarnation": inc,
        "revision": 0,
        **group_spec(pattern=f"{p}/*", streams=[f"{p}/later"]),
        "members": [],
        "targets": [target(f"{p}/a", None, None, 0, 0, 5), target(f"{p}/b", None, None, 0, 0, 0)],
    }
    assert strip_times(created) == expected
    # The sweeper's plan makes the selected streams targets: the same view, one revision on.
    assert strip_times(body) == {**expected, "revision": 1}
    # Re-confirming the identical configuration is 200 with the group as it is.
    status, again = call(server, "PUT", f"/v1/groups/{g}", {"pattern": f"{p}/*", "streams": [f"{p}/later"]})
    assert status == 200 and again == body
    status, got = call(server, "GET", f"/v1/groups/{g}")
    assert status == 200 and got == body
    # A different configuration under the same name conflicts.
    status, conflict = call(server, "PUT", f"/v1/groups/{g}", {"pattern": f"{p}/**"})
    assert (status, conflict) == (
        409,
        err("GROUP_EXISTS", f"group {g!r} exists with a different configuration"),
    )
    status, listing = call(server, "GET", "/v1/groups")
    assert status == 200
    assert {
        "group": g,
        "bucket": "default",
        "incarnation": inc,
        "revision": 1,
        "members": 0,
        "targets": 2,
    } in listing["groups"]

    # Cursors die with the incarnation; the name is free again.
    view = join(server, g, "m1", "j1")
    status, _ = heartbeat(
        server, g, view, commits=[{"stream": f"{p}/a", "fence": 2, "offset": format_offset(5)}]
    )
    assert status == 200
    assert call(server, "DELETE", f"/v1/groups/{g}?incarnation={inc}") == (204, None)
    assert call(server, "DELETE", f"/v1/groups/{g}?incarnation={inc}") == (204, None)  # a retried delete
    assert call(server, "GET", f"/v1/groups/{g}") == (
        404,
        err("GROUP_NOT_FOUND", f"group {g!r} does not exist"),
    )
    assert call(server, "DELETE", f"/v1/groups/{g}") == (
        404,
        err("GROUP_NOT_FOUND", f"group {g!r} does not exist"),
    )
    status, body = call(server, "PUT", f"/v1/groups/{g}", {"pattern": f"{p}/*"})
    assert status == 201 and body["incarnation"] == inc + 1 and body["revision"] == 0
    assert [t["cursor"] for t in body["targets"]] == [Z, Z]
    # The old incarnation's member is fenced.
    status, fenced = heartbeat(server, g, view)
    assert (status, fenced) == (
        409,
        err(
            "FENCED",
            f"incarnation {inc} of group {g!r} was retired",
            reason="incarnation",
            incarnation=inc + 1,
        ),
    )
    status, fenced = call(server, "DELETE", f"/v1/groups/{g}?incarnation={inc}")
    assert (status, fenced) == (
        409,
        err(
            "FENCED",
            f"incarnation {inc} of group {g!r} was retired",
            reason="incarnation",
            incarnation=inc + 1,
        ),
    )


def test_create_refusals(server: ServerProcess) -> None:
    g, p = names()
    make_streams(server, p, ("a", b""), ("b", b""))
    cases: list[tuple[Any, int, dict[str, Any]]] = [
        ({}, 400, err("BAD_REQUEST", "a group needs a pattern, streams, or both")),
        # One glob rule for groups and subscriptions: whole-segment wildcards, nothing under __ds/.
        ({"pattern": "x/**y"}, 400, err("BAD_REQUEST", WHOLE_SEGMENTS)),
        ({"pattern": "ev/*x"}, 400, err("BAD_REQUEST", WHOLE_SEGMENTS)),
        (
            {"pattern": "__ds/*"},
            400,
            err("BAD_REQUEST", "pattern '__ds/*' is under the reserved __ds/ prefix"),
        ),
        (
            {"pattern": "x//y"},
            400,
            err("BAD_REQUEST", "pattern 'x//y' segments must be non-empty and not '.' or '..'"),
        ),
        (
            {"streams": ["a/../b"]},
            400,
            err(
                "BAD_REQUEST",
                "invalid stream path 'a/../b': stream path segments must be non-empty and not '.' or '..'",
            ),
        ),
        (
            {"pattern": "x", "session_timeout_ms": 10},
            400,
            err("BAD_REQUEST", "session_timeout_ms must be between 1000 and 600000"),
        ),
        (
            {"pattern": "x", "max_members": 0},
            400,
            err("BAD_REQUEST", "max_members must be between 1 and 256"),
        ),
        (
            {"pattern": "x", "max_streams": 5000},
            400,
            err("BAD_REQUEST", "max_streams must be between 1 and 4096"),
        ),
        (
            {"pattern": "x", "bucket": "No"},
            400,
            err(
                "BAD_REQUEST",
                "bucket names are 3-63 characters of lowercase letters, digits and '-', starting and ending with a letter or digit",
            ),
        ),
        (
            {"pattern": "x", "bucket": "nope-bucket"},
            404,
            err("BUCKET_NOT_FOUND", "bucket 'nope-bucket' does not exist"),
        ),
        (
            {"pattern": "x", "colour": "red"},
            400,
            err("BAD_REQUEST", "invalid request body: Object contains unknown field `colour`"),
        ),
        (
            {"pattern": 7},
            400,
            err("BAD_REQUEST", "invalid request body: Expected `str | null`, got `int` - at `$.pattern`"),
        ),
        (
            {"pattern": f"{p}/*", "max_streams": 1},
            413,
            err("TOO_MANY_STREAMS", "the group would select 2 streams; the limit is 1", limit=1),
        ),
        (
            {"streams": ["x", "y"], "max_streams": 1},
            413,
            err("TOO_MANY_STREAMS", "the group would select 2 streams; the limit is 1", limit=1),
        ),
    ]
    for body, status, expected in cases:
        assert call(server, "PUT", f"/v1/groups/{g}", body) == (status, expected), body
    assert call(server, "PUT", f"/v1/groups/{g}", raw=b"{nope") == (
        400,
        err("BAD_REQUEST", "invalid request body: JSON is malformed: object keys must be strings (byte 1)"),
    )
    assert call(server, "PUT", "/v1/groups/-bad", {"pattern": "x"}) == (
        400,
        err(
            "BAD_REQUEST",
            "group names are 1-128 characters of letters, digits, '.', '_' and '-', starting with a letter or digit",
        ),
    )
    assert call(server, "GET", f"/v1/groups/{g}") == (
        404,
        err("GROUP_NOT_FOUND", f"group {g!r} does not exist"),
    )
    status, body = call(server, "PATCH", f"/v1/groups/{g}", {})
    assert status == 405


WHOLE_SEGMENTS = "pattern wildcards must be whole path segments: * (one segment) or ** (any number)"


def test_delete_preconditions(server: ServerProcess) -> None:
    g, p = names()
    status, body = call(server, "PUT", f"/v1/groups/{g}", {"streams": [f"{p}/x"]})
    assert status == 201
    inc = body["incarnation"]
    assert call(server, "DELETE", f"/v1/groups/{g}?revision=3") == (
        409,
        err("STALE_REVISION", f"group {g!r} is at revision 0, not 3", revision=0),
    )
    assert call(server, "DELETE", f"/v1/groups/{g}?revision=x") == (
        400,
        err("BAD_REQUEST", "query parameter revision must be a non-negative decimal integer, got 'x'"),
    )
    assert call(server, "DELETE", f"/v1/groups/{g}?incarnation={inc}&revision=0") == (204, None)


# --------------------------------------------------------------------------- membership


def test_join_heartbeat_rebalance_and_drain(server: ServerProcess) -> None:
    g, p = names_in_one_shard()
    make_streams(server, p, ("a", b"0123456789"), ("b", b"abc"))
    body, _ = create_settled(server, g, {"pattern": f"{p}/*"})
    inc = body["incarnation"]
    a, b = f"{p}/a", f"{p}/b"

    v1 = join(server, g, "m1", "j1")
    assert v1 == member_view(g, inc, 2, "m1", 1, [(a, 2, 0, False), (b, 2, 0, False)])
    assert join(server, g, "m1", "j1") == v1  # a retried join changes nothing

    # Commits move cursors; a lower one never moves them back.
    status, hb = heartbeat(server, g, v1, commits=[{"stream": a, "fence": 2, "offset": format_offset(4)}])
    assert (status, hb) == (
        200,
        member_view(g, inc, 2, "m1", 1, [(a, 2, 4, False), (b, 2, 0, False)], rejected=[]),
    )
    status, hb = heartbeat(server, g, v1, commits=[{"stream": a, "fence": 2, "offset": format_offset(2)}])
    assert (status, hb) == (
        200,
        member_view(g, inc, 2, "m1", 1, [(a, 2, 4, False), (b, 2, 0, False)], rejected=[]),
    )

    # A second member: the move is intent first; m1 is told to release b.
    v2 = join(server, g, "m2", "j2")
    assert v2 == member_view(g, inc, 3, "m2", 2, [], pending=[b])
    status, hb = heartbeat(server, g, v1)
    assert (status, hb) == (
        200,
        member_view(g, inc, 3, "m1", 1, [(a, 2, 4, False), (b, 2, 0, True)], rejected=[]),
    )
    status, desc = call(server, "GET", f"/v1/groups/{g}")
    assert strip_times(desc) == {
        "group": g,
        "incarnation": inc,
        "revision": 3,
        **group_spec(pattern=f"{p}/*"),
        "members": [{"member": "m1", "generation": 1}, {"member": "m2", "generation": 2}],
        "targets": [target(a, "m1", "m1", 2, 4, 10), target(b, "m2", "m1", 2, 0, 3)],
    }

    # m1 commits and releases b in one heartbeat; m2 is activated with a higher fence.
    status, hb = heartbeat(
        server,
        g,
        v1,
        commits=[{"stream": b, "fence": 2, "offset": format_offset(2)}],
        releases=[{"stream": b, "fence": 2}],
    )
    assert (status, hb) == (200, member_view(g, inc, 4, "m1", 1, [(a, 2, 4, False)], rejected=[]))
    status, hb = heartbeat(server, g, v2)
    assert (status, hb) == (200, member_view(g, inc, 4, "m2", 2, [(b, 4, 2, False)], rejected=[]))

    # Per-item refusals: a stale fence, past the tail, a stream not held.
    status, hb = heartbeat(
        server,
        g,
        v1,
        commits=[
            {"stream": b, "fence": 2, "offset": format_offset(3)},
            {"stream": a, "fence": 2, "offset": format_offset(11)},
            {"stream": f"{p}/zzz", "fence": 2, "offset": format_offset(0)},
        ],
        releases=[{"stream": b, "fence": 2}],  # already released: a harmless no-op
    )
    assert (status, hb) == (
        200,
        member_view(
            g,
            inc,
            4,
            "m1",
            1,
            [(a, 2, 4, False)],
            rejected=[
                {"stream": b, "code": "FENCED", "message": f"'m1' does not hold {b!r} with fence 2"},
                {"stream": a, "code": "OFFSET_BEYOND_TAIL", "message": f"offset is beyond the tail of {a!r}"},
                {
                    "stream": f"{p}/zzz",
                    "code": "FENCED",
                    "message": f"'m1' does not hold '{p}/zzz' with fence 2",
                },
            ],
        ),
    )

    # Member-level refusals.
    assert heartbeat(server, g, {**v1, "member": "ghost"}) == (
        409,
        err("NOT_MEMBER", f"'ghost' is not a member of group {g!r}; join again"),
    )
    status, _ = call(
        server, "POST", "/v1/groups/nope-group/heartbeat", {"member": "m1", "incarnation": 1, "generation": 1}
    )
    assert (status, _) == (404, err("GROUP_NOT_FOUND", "group 'nope-group' does not exist"))
    # A new instance of m1 fences the old one, and the old join id cannot come back.
    v1b = join(server, g, "m1", "j1-restarted")
    assert v1b["generation"] == 3 and v1b["revision"] == 5
    assert heartbeat(server, g, v1) == (
        409,
        err(
            "FENCED", "generation 1 of 'm1' was superseded by a newer join", reason="generation", generation=3
        ),
    )
    assert call(server, "POST", f"/v1/groups/{g}/join", {"member": "m1", "join_id": "j1"}) == (
        409,
        err("FENCED", "join 'j1' was superseded or ended; join with a new join_id", reason="join"),
    )
    # The fenced instance's stream was re-activated for the new instance, cursor intact.
    assert v1b == member_view(g, inc, 5, "m1", 3, [(a, 5, 4, False)])


def test_heartbeat_bad_requests(server: ServerProcess) -> None:
    g, p = names()
    call(server, "PUT", f"/v1/groups/{g}", {"pattern": f"{p}/*"})
    base = {"member": "m1", "incarnation": 1, "generation": 1}
    url = f"/v1/groups/{g}/heartbeat"
    cases = [
        (
            {**base, "commits": [{"stream": "s", "fence": 1, "offset": "12"}]},
            "malformed offset '12' for stream 's'",
        ),
        (
            {**base, "commits": [{"stream": "s", "fence": -1, "offset": Z}]},
            "invalid request body: Expected `int` >= 0 - at `$.commits[0].fence`",
        ),
        (
            {"member": "m1", "incarnation": 1},
            "invalid request body: Object missing required field `generation`",
        ),
        ({**base, "wait_ms": "soon"}, "invalid request body: Expected `int`, got `str` - at `$.wait_ms`"),
    ]
    for body, message in cases:
        assert call(server, "POST", url, body) == (400, err("BAD_REQUEST", message)), body
    assert call(server, "POST", url, raw=b"") == (
        400,
        err("BAD_REQUEST", "invalid request body: Input data was truncated"),
    )
    assert call(server, "POST", f"/v1/groups/{g}/join", {"member": "", "join_id": "x"}) == (
        400,
        err("BAD_REQUEST", "member must be 1-128 characters without control characters"),
    )
    assert call(server, "POST", f"/v1/groups/{g}/join", {"member": "m", "join_id": "x" * 129}) == (
        400,
        err("BAD_REQUEST", "join_id must be 1-128 characters without control characters"),
    )
    assert call(server, "POST", "/v1/groups/nope-group/join", {"member": "m", "join_id": "x"}) == (
        404,
        err("GROUP_NOT_FOUND", "group 'nope-group' does not exist"),
    )


def test_too_many_members(server: ServerProcess) -> None:
    g, p = names()
    call(server, "PUT", f"/v1/groups/{g}", {"pattern": f"{p}/*", "max_members": 2})
    join(server, g, "m1", "j1")
    join(server, g, "m2", "j2")
    assert call(server, "POST", f"/v1/groups/{g}/join", {"member": "m3", "join_id": "j3"}) == (
        409,
        err("TOO_MANY_MEMBERS", f"group {g!r} already has 2 members; the limit is 2", limit=2),
    )
    # A new instance of an existing member is not a new member.
    assert join(server, g, "m2", "j2b")["generation"] == 3


def test_stream_gone_on_commit(server: ServerProcess) -> None:
    """A commit to a stream deleted since (before the sweep noticed) is refused per item."""
    for _attempt in range(5):
        g, p = names()
        make_streams(server, p, ("a", b"xyz"))
        create_settled(server, g, {"pattern": f"{p}/*"})
        v = join(server, g, "m1", "j1")
        assert request("DELETE", stream_url(server.url, f"{p}/a"))[0] == 204
        status, hb = heartbeat(
            server, g, v, commits=[{"stream": f"{p}/a", "fence": 2, "offset": format_offset(1)}]
        )
        assert status == 200
        if hb["rejected"][0]["code"] == "FENCED":
            continue  # the sweeper dropped the stream in between (rare): try again
        assert hb == member_view(
            g,
            hb["incarnation"],
            3,
            "m1",
            1,
            [],
            rejected=[
                {"stream": f"{p}/a", "code": "STREAM_GONE", "message": f"stream '{p}/a' no longer exists"},
            ],
        )
        return
    pytest.fail("the sweeper raced every attempt")


def test_long_poll_wakes_on_plan_change_and_times_out(server: ServerProcess) -> None:
    g, p = names_in_one_shard()
    make_streams(server, p, ("a", b""), ("b", b""))
    create_settled(server, g, {"pattern": f"{p}/*", "session_timeout_ms": 4000})
    v1 = join(server, g, "m1", "j1")
    # Nothing changes: the poll waits (capped at half the session timeout).
    started = time.monotonic()
    status, hb = heartbeat(server, g, v1, revision=v1["revision"], wait_ms=60000)
    elapsed = time.monotonic() - started
    assert status == 200 and hb["revision"] == v1["revision"] and 1.9 <= elapsed < 3.5
    # A join elsewhere wakes it with the new plan.
    poll = Background(lambda: heartbeat(server, g, v1, revision=v1["revision"], wait_ms=1800))
    time.sleep(0.3)
    join(server, g, "m2", "j2")
    status, hb = poll.result()
    assert status == 200 and hb["revision"] == 3 and poll.elapsed < 1.2
    assert [(x["stream"], x["revoked"]) for x in hb["assignments"]] == [(f"{p}/a", False), (f"{p}/b", True)]
    # A poll whose member is fenced meanwhile says so.
    poll = Background(lambda: heartbeat(server, g, v1, revision=hb["revision"], wait_ms=1800))
    time.sleep(0.3)
    join(server, g, "m1", "j1-new")
    assert poll.result() == (
        409,
        err(
            "FENCED", "generation 1 of 'm1' was superseded by a newer join", reason="generation", generation=3
        ),
    )


def test_leave(server: ServerProcess) -> None:
    g, p = names()
    make_streams(server, p, ("a", b"12345"), ("b", b""))
    body, _ = create_settled(server, g, {"pattern": f"{p}/*"})
    inc = body["incarnation"]
    v1 = join(server, g, "m1", "j1")
    v2 = join(server, g, "m2", "j2")
    url = f"/v1/groups/{g}/leave"
    leave1 = {
        "member": "m1",
        "incarnation": inc,
        "generation": 1,
        "commits": [{"stream": f"{p}/a", "fence": 2, "offset": format_offset(5)}],
    }
    assert call(server, "POST", url, leave1) == (
        200,
        {"group": g, "member": "m1", "left": True, "rejected": []},
    )
    assert call(server, "POST", url, leave1) == (
        200,
        {"group": g, "member": "m1", "left": False, "rejected": []},
    )
    # m2 now holds both (activated in the plan that removed m1), a's cursor carried over.
    status, hb = heartbeat(server, g, v2)
    assert hb["assignments"] == [
        {"stream": f"{p}/a", "fence": 4, "cursor": format_offset(5), "revoked": False},
        {"stream": f"{p}/b", "fence": 4, "cursor": Z, "revoked": False},
    ]
    stale = {"member": "m2", "incarnation": inc, "generation": 1}
    assert call(server, "POST", url, stale) == (
        409,
        err(
            "FENCED", "generation 1 of 'm2' was superseded by a newer join", reason="generation", generation=2
        ),
    )
    assert call(server, "POST", url, {**stale, "incarnation": inc + 100}) == (
        409,
        err(
            "FENCED",
            f"incarnation {inc + 100} of group {g!r} was retired",
            reason="incarnation",
            incarnation=inc,
        ),
    )
    assert heartbeat(server, g, v1) == (
        409,
        err("NOT_MEMBER", f"'m1' is not a member of group {g!r}; join again"),
    )


def test_link_and_unlink(server: ServerProcess) -> None:
    g, p = names()
    make_streams(server, p, ("x/1", b"a"), ("y", b"bb"), ("z/q", b"ccc"))
    body, _ = create_settled(server, g, {"streams": [f"{p}/x/1"], "max_streams": 2})
    inc = body["incarnation"]
    url = f"/v1/groups/{g}/streams"
    status, body = call(server, "POST", url, {"streams": [f"{p}/y"], "revision": 1, "op_id": "op-1"})
    expected = {
        "group": g,
        "incarnation": inc,
        "revision": 2,
        **group_spec(streams=[f"{p}/x/1", f"{p}/y"], max_streams=2),
        "members": [],
        "targets": [target(f"{p}/x/1", None, None, 0, 0, 1), target(f"{p}/y", None, None, 0, 0, 2)],
    }
    assert (status, strip_times(body)) == (200, expected)
    # The same operation retried after it succeeded is recognised (not STALE_REVISION).
    status, again = call(server, "POST", url, {"streams": [f"{p}/y"], "revision": 1, "op_id": "op-1"})
    assert (status, strip_times(again)) == (200, expected)
    assert call(server, "POST", url, {"streams": [f"{p}/z/q"], "revision": 1}) == (
        409,
        err("STALE_REVISION", f"group {g!r} is at revision 2, not 1", revision=2),
    )
    assert call(server, "POST", url, {"streams": [f"{p}/z/q"]}) == (
        413,
        err("TOO_MANY_STREAMS", "the group would select 3 streams; the limit is 2", limit=2),
    )
    assert call(server, "POST", url, {"streams": ["bad//path"]}) == (
        400,
        err(
            "BAD_REQUEST",
            "invalid stream path 'bad//path': stream path segments must be non-empty and not '.' or '..'",
        ),
    )
    assert call(server, "POST", url, {"streams": [f"{p}/y"], "incarnation": inc + 50}) == (
        409,
        err(
            "FENCED",
            f"incarnation {inc + 50} of group {g!r} was retired",
            reason="incarnation",
            incarnation=inc,
        ),
    )
    # Unlink: the path may contain slashes, raw or percent-encoded.
    status, body = call(server, "DELETE", f"/v1/groups/{g}/streams/{p}%2Fx%2F1?revision=2")
    assert status == 200 and body["streams"] == [f"{p}/y"] and body["revision"] == 3
    status, body = call(server, "DELETE", f"/v1/groups/{g}/streams/{p}/x/1")  # already gone: idempotent
    assert status == 200 and body["revision"] == 3
    assert call(server, "DELETE", f"/v1/groups/{g}/streams/{p}/y?revision=0") == (
        409,
        err("STALE_REVISION", f"group {g!r} is at revision 3, not 0", revision=3),
    )
    assert call(server, "DELETE", f"/v1/groups/{g}/streams/%ff") == (
        400,
        err("BAD_REQUEST", "the stream path is not valid UTF-8 once percent-decoded"),
    )
    assert call(server, "DELETE", "/v1/groups/nope-group/streams/a") == (
        404,
        err("GROUP_NOT_FOUND", "group 'nope-group' does not exist"),
    )


def test_new_streams_and_expiry_are_swept(server: ServerProcess) -> None:
    g, p = names()
    make_streams(server, p, ("a", b""))
    call(server, "PUT", f"/v1/groups/{g}", {"pattern": f"{p}/*", "session_timeout_ms": 1000})
    v1 = join(server, g, "m1", "j1")
    v2 = join(server, g, "m2", "j2")
    make_streams(server, p, ("b", b""), ("c", b""))
    # m1 keeps heartbeating; m2 goes silent and expires; new streams are picked up.
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        status, hb = heartbeat(
            server,
            g,
            v1,
            releases=[
                {"stream": a["stream"], "fence": a["fence"]}
                for a in v1.get("assignments", [])
                if a["revoked"]
            ],
        )
        assert status == 200
        v1 = hb
        if [a["stream"] for a in hb["assignments"]] == [f"{p}/a", f"{p}/b", f"{p}/c"]:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"never settled: {hb}")
    assert heartbeat(server, g, v2) == (
        409,
        err("NOT_MEMBER", f"'m2' is not a member of group {g!r}; join again"),
    )
    status, desc = call(server, "GET", f"/v1/groups/{g}")
    assert [m["member"] for m in desc["members"]] == ["m1"]


# --------------------------------------------------------------------------- durability


def test_plan_and_cursors_survive_restart(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data", "--long-poll-timeout-s", "2").start()
    try:
        make_streams(srv, "r", ("a", b"0123456789"))
        create_settled(srv, "rg", {"pattern": "r/*"})
        v = join(srv, "rg", "m1", "j1")
        status, _ = heartbeat(
            srv, "rg", v, commits=[{"stream": "r/a", "fence": 2, "offset": format_offset(7)}]
        )
        assert status == 200
        before = call(srv, "GET", "/v1/groups/rg")
        srv.kill()  # no snapshot, no flush: the journal alone must hold it
        srv.start()
        assert call(srv, "GET", "/v1/groups/rg") == before
        status, hb = heartbeat(srv, "rg", v)  # the member survived too (with a grace period)
        assert (status, hb["assignments"]) == (
            200,
            [{"stream": "r/a", "fence": 2, "cursor": format_offset(7), "revoked": False}],
        )
        srv.stop()
        srv.start()
        assert call(srv, "GET", "/v1/groups/rg") == before
    finally:
        srv.stop()


def test_unavailable_when_the_journal_failed(tmp_path: Path) -> None:
    """A journal that cannot write refuses group changes with 503 UNAVAILABLE."""
    from tests.support.gc_support import HttpHarness, make_config

    async def run() -> tuple[int, Any, str | None]:
        h = HttpHarness(make_config(tmp_path / "data"))
        await h.start()
        try:
            h.s.journal.failed = OSError("disk gone")
            status, headers, raw = await h.http("PUT", "/v1/groups/ug", json_body={"pattern": "x/*"})
            return status, json.loads(raw), headers.get("Retry-After")
        finally:
            h.s.journal.failed = None
            await h.stop()

    status, body, retry = asyncio.run(run())
    assert (status, body, retry) == (
        503,
        err("UNAVAILABLE", "the journal cannot write to disk; restart the server"),
        "5",
    )


def test_appends_keep_working_alongside(server: ServerProcess) -> None:
    """Groups only read the stream state: appends to grouped streams are untouched."""
    g, p = names()
    make_streams(server, p, ("a", b""))
    create_settled(server, g, {"pattern": f"{p}/*"})
    v = join(server, g, "m1", "j1")
    status, headers, _ = append(stream_url(server.url, f"{p}/a"), "hello", "text/plain")
    assert status == 204
    status, hb = heartbeat(
        server, g, v, commits=[{"stream": f"{p}/a", "fence": 2, "offset": headers["Stream-Next-Offset"]}]
    )
    assert hb["assignments"][0]["cursor"] == headers["Stream-Next-Offset"]
