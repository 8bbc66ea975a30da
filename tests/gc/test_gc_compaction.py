"""Keyed compaction with tombstones (issue 21): keys, reads that skip removed messages, water marks.

* A JSON stream created with ``Stream-Compaction-Key: /id`` refuses a message without a key
  (400) and nothing changes; a bad pointer or a non-JSON stream is 400 at create.
* Compaction (a GC pass) keeps only the newest message per key in the cold range; a
  tombstone stays until ``compaction_tombstone_delay_s`` has passed, then goes too. Offsets
  stay: the tail, the next offsets and every kept message's offset are as before.
* A model-based property test: random appends with keys and tombstones, flushes,
  compactions (each GC pass also rewrites the objects holding removed records: physical
  compaction, ``tiered.gc.reclaim``) and restarts (clean and crash); after every step reads
  equal the model (newest per key once compacted), the water marks and record counts match,
  and after every pass ``tiered verify``'s checks pass and a second pass finds nothing to do.
* A crash between the read and the journaled ``StreamCompacted`` leaves the stream as it
  was; the next pass compacts it the same way. Retention or deletion racing a compaction
  wins (the holes are harmless below the retained offset; a deleted stream stays deleted).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gc.test_gc_compaction_reclaim import verify_errors
from tests.support.gc_support import T0, HttpHarness, make_config
from tiered.core.ids import parse_offset
from tiered.engine.streams.keyed import live_pieces, merge, plan_removals

pytestmark = pytest.mark.timeout(300)

JSON = "application/json"
DELAY_S = 100.0
DELAY_MS = int(DELAY_S * 1000)
URL = "/v1/stream/k"


def _harness(tmp_path: Path) -> HttpHarness:
    return HttpHarness(make_config(tmp_path / "data", compaction_tombstone_delay_s=DELAY_S))


async def _create(h: HttpHarness, path: str = URL, key: str = "/id") -> int:
    status, _, _ = await h.http("PUT", path, headers={"Content-Type": JSON, "Stream-Compaction-Key": key})
    return status


async def _append(h: HttpHarness, messages: list[Any], path: str = URL) -> int:
    status, _, _ = await h.http("POST", path, body=json.dumps(messages), headers={"Content-Type": JSON})
    return status


async def _read_all(h: HttpHarness, path: str = URL) -> tuple[list[Any], str]:
    """Every message from the start, following Stream-Next-Offset; and the final next offset."""
    out: list[Any] = []
    offset = "-1"
    for _ in range(10_000):
        status, headers, body = await h.http("GET", f"{path}?offset={offset}")
        assert status == 200, (status, body)
        out.extend(json.loads(body))
        offset = headers["Stream-Next-Offset"]
        if headers.get("Stream-Up-To-Date") == "true":
            return out, offset
    raise AssertionError("the read never caught up")


async def _head(h: HttpHarness, path: str = URL) -> Any:
    status, headers, _ = await h.http("HEAD", path)
    assert status == 200
    return headers


# --------------------------------------------------------------------------- pure rules


def test_plan_removals_newest_per_key_and_tombstones() -> None:
    msgs = [
        (0, 10, b'{"id":1,"v":1}\n', 0),
        (10, 20, b'{"id":2,"v":1}\n', 0),
        (20, 30, b'{"id":1,"v":2}\n', 0),
        (30, 40, b'{"id":2,"v":null}\n', 0),  # a tombstone of key 2
        (40, 50, b'{"id":"1","v":3}\n', 0),  # the string "1" is another key than the integer 1
    ]
    assert plan_removals(("id",), msgs, now_ms=5, tombstone_delay_ms=10) == [(0, 20)]
    assert plan_removals(("id",), msgs, now_ms=10, tombstone_delay_ms=10) == [(0, 20), (30, 40)]
    assert merge([(5, 6), (0, 2), (2, 3), (6, 6)]) == [(0, 3), (5, 6)]
    assert live_pieces([(2, 4), (6, 8)], 0, 10) == [(0, 2), (4, 6), (8, 10)]
    assert live_pieces([(2, 4), (6, 8)], 3, 7) == [(4, 6)]
    assert live_pieces([(0, 10)], 3, 7) == []


# --------------------------------------------------------------------------- HTTP


def test_bad_keys_are_refused_and_change_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        try:
            assert await _create(h, "/v1/stream/bad", "id") == 400  # not a JSON pointer
            assert await _create(h, "/v1/stream/bad", "/a~2") == 400  # a ~ that is no escape
            status, _, _ = await h.http(
                "PUT",
                "/v1/stream/bin",
                headers={"Content-Type": "text/plain", "Stream-Compaction-Key": "/id"},
            )
            assert status == 400  # keys need a JSON stream
            assert (await h.http("HEAD", "/v1/stream/bad"))[0] == 404
            assert (await h.http("HEAD", "/v1/stream/bin"))[0] == 404
            assert await _create(h) == 201
            assert await _create(h) == 200  # the same create again: idempotent
            assert await _create(h, key="/other") == 409  # another key: a different stream
            status, _, _ = await h.http("PUT", URL, headers={"Content-Type": JSON})
            assert status == 409  # no key at all: a different stream too
            head = await _head(h)
            assert head["Stream-Compaction-Key"] == "/id"
            tail = head["Stream-Next-Offset"]
            assert await _append(h, [{"id": 1}, {"name": "no key"}]) == 400
            assert await _append(h, [{"id": [1]}]) == 400  # a key is a string or an integer
            assert await _append(h, [{"id": True}]) == 400
            assert await _append(h, ["not an object"]) == 400
            assert (await _head(h))["Stream-Next-Offset"] == tail  # nothing of a refused append stored
            assert await _append(h, [{"id": 1, "v": "a"}, {"id": "x", "v": None}]) == 204
            status, _, _ = await h.http(
                "PUT",
                "/v1/stream/body",
                body=b'[{"v":1}]',
                headers={"Content-Type": JSON, "Stream-Compaction-Key": "/id"},
            )
            assert status == 400  # a create's body is checked the same way
        finally:
            await h.stop()

    asyncio.run(main())


def test_compaction_keeps_newest_per_key_offsets_stable(tmp_path: Path) -> None:
    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        try:
            assert await _create(h) == 201
            await _append(h, [{"id": 1, "v": 1}, {"id": 2, "v": 1}, {"id": 3, "v": 1}])
            await _append(h, [{"id": 1, "v": 2}, {"id": 2, "v": None}])  # key 2 deleted
            await _append(h, [{"id": 4, "v": 1}])
            tail = (await _head(h))["Stream-Next-Offset"]
            assert await h.flush() == 1
            await _append(h, [{"id": 1, "v": 3}])  # hot: not compacted yet, and 1's v2 stays (cold newest)
            before, _ = await _read_all(h)
            report = await h.gc(T0)
            assert report.errors == [] and report.streams_compacted == 1 and report.messages_compacted == 2
            after, next_offset = await _read_all(h)
            assert after == [
                {"id": 3, "v": 1},
                {"id": 1, "v": 2},
                {"id": 2, "v": None},
                {"id": 4, "v": 1},
                {"id": 1, "v": 3},
            ]
            assert len(before) == 7
            head = await _head(h)
            assert head["Stream-Next-Offset"] == next_offset != tail
            assert head["Stream-High-Water-Mark"] == next_offset
            assert head["Stream-Low-Water-Mark"] != head["Stream-Retained-Offset"]  # the first message went
            assert head["Stream-Record-Count"] == "5"  # ordinals follow the removals
            # A read from the low-water mark starts with the first kept message.
            status, _, body = await h.http("GET", f"{URL}?offset={head['Stream-Low-Water-Mark']}")
            assert status == 200 and json.loads(body)[0] == {"id": 3, "v": 1}
            again = await h.gc(T0 + 1)
            assert again.streams_compacted == 0  # idempotent: nothing new to remove
            # The tombstone goes once it is older than the delay.
            gone = await h.gc(T0 + DELAY_MS + 1)
            assert gone.streams_compacted == 1
            final, _ = await _read_all(h)
            assert final == [{"id": 3, "v": 1}, {"id": 1, "v": 2}, {"id": 4, "v": 1}, {"id": 1, "v": 3}]
            # The listing shows the water marks.
            status, _, raw = await h.http("GET", "/v1/stream")
            assert status == 200, raw
            [entry] = [e for e in json.loads(raw)["streams"] if e["path"] == "k"]
            assert entry["low_water_mark"] == head["Stream-Low-Water-Mark"]
            assert entry["high_water_mark"] == next_offset
            await h.restart(crash=True)
            assert (await _read_all(h))[0] == final  # the holes are journal state
            await h.restart()
            assert (await _read_all(h))[0] == final  # and snapshot state
        finally:
            await h.stop()

    asyncio.run(main())


# --------------------------------------------------------------------------- model-based property test


class Model:
    """What the stream must read: every message appended, minus what compaction may remove.

    ``cold``: how many of the appended messages are in the cold tier (flushed). After a
    compaction at ``now``, a cold message is gone when a newer cold message has its key, or
    when it is a tombstone that is the newest of its key and was flushed ``DELAY_MS`` ago.
    """

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.flushed_ms: list[int] = []  # per cold message: when its flush ran
        self.gone: set[int] = set()  # indexes of removed messages

    def compact(self, now: int) -> None:
        cold = len(self.flushed_ms)
        newest: dict[Any, int] = {}
        for i in range(cold):
            if i in self.gone:
                continue
            key = (type(self.messages[i]["id"]).__name__, self.messages[i]["id"])
            if key in newest:
                self.gone.add(newest[key])
            newest[key] = i
        for i in newest.values():
            if self.messages[i].get("v", 0) is None and self.flushed_ms[i] + DELAY_MS <= now:
                self.gone.add(i)

    def visible(self) -> list[dict[str, Any]]:
        return [m for i, m in enumerate(self.messages) if i not in self.gone]


message = st.tuples(st.one_of(st.integers(0, 3), st.sampled_from(["a", "0"])), st.booleans())
# One round: appends, then maybe a flush, a compaction (after 0, 1 or 2 tombstone delays), a restart.
round_ = st.tuples(
    st.lists(st.lists(message, min_size=1, max_size=4), min_size=1, max_size=3),
    st.booleans(),
    st.one_of(st.none(), st.integers(0, 2)),
    st.one_of(st.none(), st.booleans()),
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(rounds=st.lists(round_, min_size=1, max_size=6))
def test_reads_equal_the_model(tmp_path_factory: pytest.TempPathFactory, rounds: list[Any]) -> None:
    tmp_path = tmp_path_factory.mktemp("keyed")

    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        model = Model()
        try:
            assert await _create(h) == 201
            for batches, flush, delays, restart in rounds:
                for batch in batches:
                    msgs = [{"id": k, "v": None if dead else len(model.messages)} for k, dead in batch]
                    assert await _append(h, msgs) == 204
                    model.messages.extend(msgs)
                if flush:
                    h.clock.advance(1000)
                    await h.flush()
                    model.flushed_ms.extend([_flush_ms(h)] * (len(model.messages) - len(model.flushed_ms)))
                if delays is not None:
                    now = h.clock.advance(delays * DELAY_MS)
                    report = await h.gc(now)  # compaction, then its objects rewritten (``reclaim``)
                    assert report.errors == [] and report.integrity_errors == [], report
                    model.compact(now)
                    assert await verify_errors(h) == []  # rows tile what is read, digests follow storage
                    again = await h.gc(now)  # physical compaction left nothing to reclaim
                    assert again.objects_compacted == 0 and again.streams_compacted == 0, again
                if restart is not None:
                    await h.restart(crash=restart)
                await _check(h, model)
        finally:
            await h.stop()

    asyncio.run(main())


async def _check(h: HttpHarness, model: Model) -> None:
    got, next_offset = await _read_all(h)
    assert got == model.visible()
    head = await _head(h)
    assert head["Stream-High-Water-Mark"] == head["Stream-Next-Offset"] == next_offset
    assert head["Stream-Record-Count"] == str(len(model.visible()))
    if model.visible():
        status, _, body = await h.http("GET", f"{URL}?offset={head['Stream-Low-Water-Mark']}")
        assert status == 200 and json.loads(body)[0] == model.visible()[0]


def _flush_ms(h: HttpHarness) -> int:
    """When the newest cold object was written (what a tombstone's age is measured from)."""
    objs = h.s.state.cold_objects.values()
    return max(o.created_ms for o in objs) if objs else 0


# --------------------------------------------------------------------------- crashes and races


class Crash(BaseException):
    """A simulated SIGKILL at a step of the compaction (BaseException: nothing catches it)."""


UPDATES = [[{"id": k % 3, "v": k} for k in range(i, i + 4)] for i in range(0, 12, 4)]
NEWEST = [{"id": 0, "v": 9}, {"id": 1, "v": 10}, {"id": 2, "v": 11}]


async def _keyed_cold_stream(h: HttpHarness, url: str = URL) -> list[Any]:
    """Three batches of updates of keys 0, 1, 2, each flushed to its own cold object."""
    assert await _create(h, url) == 201
    for batch in UPDATES:
        assert await _append(h, batch, url) == 204
        assert await h.flush() == 1
    everything, _ = await _read_all(h, url)
    assert len(everything) == 12
    return everything


@pytest.mark.parametrize("step", ["reading", "committing", "committed"])
def test_crash_at_every_step_of_a_compaction(tmp_path: Path, step: str) -> None:
    """Killed while reading the cold range, while journaling, or right after: the stream reads
    all of it (nothing removed) or exactly the compacted view, never a part; the next pass
    finishes the work and the restart after it keeps it."""

    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        try:
            everything = await _keyed_cold_stream(h)
            ctx = h.s.gc.ctx
            if step == "reading":

                async def read(*args: Any, **kwargs: Any) -> bytes:
                    raise Crash()

                ctx.reader.read = read  # type: ignore[method-assign]
            else:
                inner_commit = ctx.committer.commit

                async def commit(records: Any) -> None:
                    if step == "committing":
                        raise Crash()
                    await inner_commit(records)
                    raise Crash()

                ctx.committer.commit = commit  # type: ignore[method-assign]
            with pytest.raises(Crash):
                await h.gc(T0)
            await h.restart(crash=True)
            got, _ = await _read_all(h)
            assert got == (NEWEST if step == "committed" else everything)
            report = await h.gc(T0)
            assert report.errors == [] and report.streams_compacted == (0 if step == "committed" else 1)
            assert (await _read_all(h))[0] == NEWEST
            await h.restart(crash=True)
            assert (await _read_all(h))[0] == NEWEST
            assert (await _head(h))["Stream-Record-Count"] == "3"
        finally:
            await h.stop()

    asyncio.run(main())


@pytest.mark.parametrize("race", ["retention", "delete", "erasure"])
def test_compaction_racing_a_release(tmp_path: Path, race: str) -> None:
    """A release landing while the compaction reads (retention past part of the range, the
    stream's delete, its bucket's erasure) wins: the retained offset, the deletion and the
    erasure stand, the objects go after the grace, no object leaks, reads stay the model's."""

    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        try:
            bucket = "keyed" if race == "erasure" else "default"  # the default bucket cannot be erased
            url = f"/v1/buckets/{bucket}/stream/k"
            if race == "erasure":
                await h.bucket(bucket)
            await _keyed_cold_stream(h, url)
            ctx = h.s.gc.ctx
            inner = ctx.reader.read
            s = h.s.streams.lookup(bucket, "k")
            sizes = [
                len(json.dumps(m, separators=(",", ":"))) + 1 for m in UPDATES[0] + UPDATES[1] + UPDATES[2]
            ]
            cut = s.retained_from + sum(sizes[:8])  # retention to the third object (its 9th message)
            first_kept = s.retained_from + sum(sizes[:9])  # the newest of key 0: the first survivor

            released: list[bool] = []

            async def read(*args: Any, **kwargs: Any) -> bytes:
                data = await inner(*args, **kwargs)
                if released:
                    return data
                released.append(True)
                if race == "retention":
                    await h.s.streams.retain_from(bucket, "k", cut)
                elif race == "delete":
                    await h.s.streams.delete(bucket, "k")
                else:
                    await h.s.streams.erase_bucket(bucket)
                return data

            ctx.reader.read = read  # type: ignore[method-assign]
            report = await h.gc(T0)
            ctx.reader.read = inner  # type: ignore[method-assign]
            assert report.errors == []
            if race == "retention":
                assert report.streams_compacted == 1
                head = await _head(h, url)
                assert parse_offset(head["Stream-Retained-Offset"]) == cut
                assert parse_offset(head["Stream-Low-Water-Mark"]) == first_kept
                assert (await _read_all(h, url))[0] == NEWEST
            else:
                assert report.streams_compacted == 0  # the stream went meanwhile: nothing journaled
                assert (await h.http("HEAD", url))[0] in (404, 410)
            # Released objects go after the grace; reconciliation finds nothing left over.
            for at in (T0 + 1, T0 + 20_000, T0 + 40_000):
                assert (await h.gc(at, reconcile=True)).errors == []
            await h.restart(crash=True)
            stored = {i.key async for i in h.s.store.list("data/")}
            assert stored == set(h.s.state.cold_objects)
            assert all(o.refs > 0 for o in h.s.state.cold_objects.values())
        finally:
            await h.stop()

    asyncio.run(main())


def test_bootstrap_skips_removed_messages(tmp_path: Path) -> None:
    """A bootstrap read (snapshot + what follows) of a compacted stream answers the kept messages only."""

    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        try:
            await _keyed_cold_stream(h)
            assert (await h.gc(T0)).streams_compacted == 1
            status, headers, body = await h.http("GET", f"{URL}?bootstrap")
            assert status == 200, body
            assert headers["Content-Type"].startswith("multipart/mixed")
            for m in NEWEST:
                assert json.dumps(m, separators=(",", ":")).encode() in body
            for m in UPDATES[0] + UPDATES[1]:  # every one of these was superseded
                assert json.dumps(m, separators=(",", ":")).encode() not in body
        finally:
            await h.stop()

    asyncio.run(main())


def test_key_reads(tmp_path: Path) -> None:
    """``GET {stream}?key=K``: the newest message of a key with its offset, before and after
    compaction; a deleted or unknown key is 404; bad requests are 400."""

    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        try:
            await _keyed_cold_stream(h)
            await _append(h, [{"id": "0", "v": "string key"}, {"id": 5, "v": 1}, {"id": 5, "v": None}])
            for compacted in (False, True):
                if compacted:
                    await h.flush()
                    assert (await h.gc(T0)).streams_compacted == 1
                for key, want in ((0, NEWEST[0]), (2, NEWEST[2]), ('"0"', {"id": "0", "v": "string key"})):
                    status, headers, body = await h.http("GET", f"{URL}?key={key}")
                    assert status == 200, body
                    assert json.loads(body) == want
                    offset = headers["Stream-Key-Offset"]
                    status, _, body = await h.http("GET", f"{URL}?offset={offset}")
                    assert json.loads(body)[0] == want  # the offset is the message's
                assert (await h.http("GET", f"{URL}?key=5"))[0] == 404  # deleted by its tombstone
                assert (await h.http("GET", f"{URL}?key=99"))[0] == 404
                assert (await h.http("GET", f"{URL}?key=abc"))[0] == 400  # not JSON: "abc" is
                assert (await h.http("GET", f"{URL}?key=1.5"))[0] == 400
                assert (await h.http("GET", f"{URL}?key=0&offset=-1"))[0] == 400
            await h.http("PUT", "/v1/stream/plain", headers={"Content-Type": JSON})
            assert (await h.http("GET", "/v1/stream/plain?key=1"))[0] == 400  # not a keyed stream
        finally:
            await h.stop()

    asyncio.run(main())


def test_unchanged_streams_are_not_read_again_until_a_tombstone_falls_due(tmp_path: Path) -> None:
    async def main() -> None:
        h = _harness(tmp_path)
        await h.start()
        try:
            await _keyed_cold_stream(h)
            await _append(h, [{"id": 7, "v": None}])  # a tombstone
            await h.flush()
            ctx = h.s.gc.ctx
            inner = ctx.reader.read
            reads: list[Any] = []

            async def read(*args: Any, **kwargs: Any) -> bytes:
                reads.append(args)
                return await inner(*args, **kwargs)

            ctx.reader.read = read  # type: ignore[method-assign]
            assert (await h.gc(T0)).streams_compacted == 1 and reads
            reads.clear()
            assert (await h.gc(T0 + 1)).streams_compacted == 0
            assert reads == []  # nothing changed, no tombstone due: not read again
            await _append(h, [{"id": 0, "v": "new"}])
            await h.flush()
            assert (await h.gc(T0 + 2)).streams_compacted == 1 and reads  # the cold range grew
            reads.clear()
            assert (await h.gc(T0 + 3)).streams_compacted == 0 and reads == []
            assert (await h.gc(T0 + DELAY_MS + 1000)).streams_compacted == 1  # the tombstone is due
            assert {"id": 7, "v": None} not in (await _read_all(h))[0]
        finally:
            await h.stop()

    asyncio.run(main())
