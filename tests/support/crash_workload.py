"""Client-side workload and model for ``tests/engine/test_crash_recovery.py``.

Every byte a writer sends is a *payload* that encodes who sent it
(stream, writer, producer epoch, sequence) plus a CRC32 over the whole
payload, so a misplaced or corrupted byte can be attributed to exactly one
payload. Payloads shorter than the 20-byte header are a deterministic hash of
the same identity.

The model keeps, per stream, the exact bytes verified after the last restart
(``content``), the appends acknowledged since then (``pending``: the offset
range comes from ``Stream-Next-Offset``) and the appends that were in flight
when the server was killed (``candidates``: they may or may not have been
stored, but only whole). After a restart, a stream must be::

    content (unchanged)  +  an interleaving of pending (each at exactly its
    acknowledged range) and whole candidates (each at most once)

and nothing else. Candidates that turn up become part of the history; the
rest are gone for good and must never appear later.

Offsets are opaque to the protocol; this server mints them as the byte
position printed as ``16digits_16digits``, which is what lets an ack say
where its bytes live (``[next_offset - len(body), next_offset)``).
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import struct
import zlib
from dataclasses import dataclass, field

import aiohttp

OCTET = "application/octet-stream"
MAGIC = b"\xc5W"
# magic, stream, writer, epoch, seq, total length, crc32 (over the payload with crc zeroed)
HEADER = struct.Struct("<2sBBIIII")
KiB = 1024

PROBE_WRITER = 200  # single synchronous appends that check where the tail is
CREATE_WRITER = 201  # bodies of streams created with initial content
STALE_WRITER_SEQ = 999_999  # seq used by requests that must be refused


class ServerGone(Exception):
    """The server went away mid-request (we killed it)."""


# ----------------------------------------------------------------- payloads


def make_payload(stream: int, writer: int, epoch: int, seq: int, size: int) -> bytes:
    """A deterministic, self-identifying payload of exactly ``size`` bytes."""
    ident = f"{stream}/{writer}/{epoch}/{seq}"
    if size < HEADER.size:
        return hashlib.blake2b(ident.encode(), digest_size=size).digest()
    body = random.Random(ident).randbytes(size - HEADER.size)
    head = HEADER.pack(MAGIC, stream, writer, epoch, seq, size, 0)
    crc = zlib.crc32(body, zlib.crc32(head))
    return HEADER.pack(MAGIC, stream, writer, epoch, seq, size, crc) + body


def describe_at(data: bytes | bytearray, pos: int) -> str:
    """What the bytes at ``pos`` look like, for failure messages."""
    if pos >= len(data):
        return f"end of data (len {len(data)})"
    if data[pos : pos + 2] == MAGIC and len(data) - pos >= HEADER.size:
        _, s, w, e, q, n, crc = HEADER.unpack_from(data, pos)
        whole = bytes(data[pos : pos + n])
        ok = "incomplete"
        if len(whole) == n:
            head = HEADER.pack(MAGIC, s, w, e, q, n, 0)
            ok = "crc ok" if zlib.crc32(whole[HEADER.size :], zlib.crc32(head)) == crc else "CRC BAD"
        return f"payload(stream={s} writer={w} epoch={e} seq={q} len={n}, {ok}) at {pos}"
    return f"unframed bytes {bytes(data[pos : pos + 16]).hex()} at {pos}"


def pick_size(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.15:
        return rng.randint(1, HEADER.size - 1)
    if r < 0.55:
        return rng.randint(HEADER.size, KiB)
    if r < 0.85:
        return rng.randint(KiB + 1, 16 * KiB)
    return rng.randint(16 * KiB + 1, 64 * KiB)


def parse_offset(token: str) -> int:
    hi, sep, lo = token.partition("_")
    assert sep and len(hi) == 16 and len(lo) == 16 and hi.isdigit() and lo.isdigit(), token
    return int(hi) * 10**16 + int(lo)


# -------------------------------------------------------------------- model


@dataclass(eq=False)
class Attempt:
    """One append request as sent (a retry re-sends the same Attempt)."""

    stream: int
    writer: int
    epoch: int
    seq: int
    payload: bytes
    producer: bool
    close: bool = False
    start: int | None = None  # stream offset once acknowledged or found
    end_token: str | None = None  # Stream-Next-Offset from its ack, if any
    how: str = ""  # "ack" | "found" | "retry"

    @property
    def end(self) -> int:
        assert self.start is not None
        return self.start + len(self.payload)

    def __repr__(self) -> str:
        kind = "producer" if self.producer else "plain"
        where = f"@[{self.start},{self.end})" if self.start is not None else "@?"
        extra = " +close" if self.close else ""
        return (
            f"<{kind} append stream={self.stream} writer={self.writer} epoch={self.epoch} "
            f"seq={self.seq} len={len(self.payload)}{extra} {where} {self.how}>"
        )


@dataclass(eq=False)
class StreamModel:
    index: int
    name: str
    content: bytearray = field(default_factory=bytearray)  # verified bytes [0, len)
    tail_token: str = ""  # the server's offset token for len(content)
    tail: int = 0  # expected tail including pending appends
    pieces: list[Attempt] = field(default_factory=list)  # verified appends, in order
    pending: list[Attempt] = field(default_factory=list)  # acked, not yet verified
    candidates: list[Attempt] = field(default_factory=list)  # in flight at the kill
    closed: bool = False  # verified (or acknowledged) closed
    closing: Attempt | None = None  # the append-and-close, once sent


@dataclass(eq=False)
class Writer:
    wid: int
    stream: int
    producer: bool
    rng: random.Random
    epoch: int = 0
    next_seq: int = 0
    last_acked: Attempt | None = None
    in_flight: Attempt | None = None
    done: bool = False  # its stream is closed

    @property
    def producer_id(self) -> str:
        return f"producer-{self.wid}"

    def new_attempt(self, size: int, close: bool = False) -> Attempt:
        att = Attempt(
            self.stream,
            self.wid,
            self.epoch,
            self.next_seq,
            make_payload(self.stream, self.wid, self.epoch, self.next_seq, size),
            self.producer,
            close,
        )
        self.next_seq += 1
        return att

    def headers(self, att: Attempt) -> dict[str, str]:
        h = {"Content-Type": OCTET}
        if att.producer:
            h.update(
                {
                    "Producer-Id": self.producer_id,
                    "Producer-Epoch": str(att.epoch),
                    "Producer-Seq": str(att.seq),
                }
            )
        if att.close:
            h["Stream-Closed"] = "true"
        return h


def decompose(buf: bytes, cands: list[Attempt]) -> list[Attempt] | None:
    """An order of distinct candidates whose payloads concatenate to ``buf`` exactly."""
    if not buf:
        return []
    for i, c in enumerate(cands):
        if buf.startswith(c.payload):
            rest = decompose(buf[len(c.payload) :], cands[:i] + cands[i + 1 :])
            if rest is not None:
                return [c, *rest]
    return None


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def h(self, name: str) -> str | None:
        for k, v in self.headers.items():
            if k.lower() == name.lower():
                return v
        return None

    def __repr__(self) -> str:
        shown = {k: v for k, v in self.headers.items() if k.startswith(("Stream", "Producer"))}
        return f"<{self.status} {shown} {self.body[:200]!r}>"


# ------------------------------------------------------------------ harness


class CrashHarness:
    """Drives the workload against one server (restarted in place) and checks it."""

    def __init__(
        self,
        server,  # tests.support.server_process.ServerProcess
        seed: int,
        *,
        n_streams: int = 8,
        close_cycle: int | None = 2,
        bump_cycle: int | None = 1,
        log=print,
    ) -> None:
        self.server = server
        self.seed = seed
        self.rng = random.Random(f"harness/{seed}")  # for choices that may depend on timing
        kill_rng = random.Random(f"kills/{seed}")  # kill moments depend on the seed alone
        self.kill_delays = [kill_rng.uniform(0.2, 1.5) for _ in range(100)]
        self.log = log
        self.streams = [StreamModel(i, f"crash-{seed}-s{i}") for i in range(n_streams)]
        # Writers 0..n-1 append plainly, n..2n-1 are idempotent producers; each stream has one of each.
        self.writers = [
            Writer(w, w % n_streams, w >= n_streams, random.Random(f"writer/{seed}/{w}"))
            for w in range(2 * n_streams)
        ]
        self.probe = Writer(PROBE_WRITER, -1, False, random.Random(f"probe/{seed}"))
        self.close_cycle = close_cycle
        self.closer = self.writers[2 * n_streams - 1]  # the producer on the last stream closes it
        self.bump_cycle = bump_cycle
        self.bumped = self.writers[n_streams]  # the producer on stream 0 starts a new epoch
        self.extra: list[tuple[str, bytes, bool]] = []  # streams created with content: (name, body, closed)
        self.stats = {"acked": 0, "in_flight": 0, "found": 0, "lost": 0, "retried_200": 0, "retried_204": 0}
        self.session: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------- plumbing

    async def __aenter__(self) -> CrashHarness:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._close_session()

    async def _close_session(self) -> None:
        if self.session is not None:
            await self.session.close()
            self.session = None

    async def new_session(self) -> None:
        """A fresh connection pool for a fresh server process."""
        await self._close_session()
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64), timeout=aiohttp.ClientTimeout(total=30)
        )

    def url(self, name: str) -> str:
        return f"{self.server.url}/v1/stream/{name}"

    async def request(
        self, method: str, name: str, *, data: bytes | None = None, headers=None, params=None
    ) -> Response:
        assert self.session is not None
        try:
            async with self.session.request(
                method, self.url(name), data=data, headers=headers, params=params
            ) as r:
                body = await r.read()
                return Response(r.status, dict(r.headers), body)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise ServerGone(f"{method} {name}: {exc!r}") from exc

    async def read_all(self, name: str, offset: str = "-1") -> tuple[bytes, str, bool]:
        """Catch-up read from ``offset`` to the tail: (bytes, tail token, closed)."""
        out = bytearray()
        for _ in range(100_000):
            r = await self.request("GET", name, params={"offset": offset})
            assert r.status == 200, f"GET {name} offset={offset}: {r}"
            out += r.body
            nxt = r.h("Stream-Next-Offset")
            assert nxt is not None, r
            start = 0 if offset == "-1" else parse_offset(offset)
            assert parse_offset(nxt) == start + len(r.body), (
                f"GET {name} offset={offset} returned {len(r.body)} bytes but Stream-Next-Offset {nxt}"
            )
            offset = nxt
            if r.h("Stream-Up-To-Date") == "true":
                return bytes(out), nxt, r.h("Stream-Closed") == "true"
        raise AssertionError(f"read of {name} never became up to date")

    # ---------------------------------------------------------------- setup

    async def create_streams(self) -> None:
        await self.new_session()
        for m in self.streams:
            r = await self.request("PUT", m.name, headers={"Content-Type": OCTET})
            assert r.status == 201, f"create {m.name}: {r}"
            m.tail_token = r.h("Stream-Next-Offset") or ""
            assert parse_offset(m.tail_token) == 0, r

    # ------------------------------------------------------- acknowledgements

    def _record_ack(self, m: StreamModel, att: Attempt, r: Response, how: str) -> None:
        token = r.h("Stream-Next-Offset")
        assert token is not None, f"{att}: ack without Stream-Next-Offset: {r}"
        att.start = parse_offset(token) - len(att.payload)
        att.end_token = token
        att.how = how
        m.pending.append(att)

    # ----------------------------------------------------------------- load

    async def _writer_loop(self, w: Writer, cycle: int, errors: list[str]) -> None:
        m = self.streams[w.stream]
        sent = 0
        while not w.done:
            close = (
                w is self.closer and self.close_cycle is not None and cycle >= self.close_cycle and sent == 2
            )
            att = w.new_attempt(pick_size(w.rng), close)
            if close:
                m.closing = att
            w.in_flight = att
            try:
                r = await self.request("POST", m.name, data=att.payload, headers=w.headers(att))
            except ServerGone:
                return  # killed: att stays in flight
            w.in_flight = None
            sent += 1
            ok_status = 200 if w.producer else 204
            if r.status == ok_status:
                self._record_ack(m, att, r, "ack")
                self.stats["acked"] += 1
                if w.producer:
                    w.last_acked = att
                if r.h("Stream-Closed") == "true" and not close:
                    errors.append(f"{att}: ack says the stream is closed: {r}")
                if close:
                    if r.h("Stream-Closed") != "true":
                        errors.append(f"{att}: append-and-close ack lacks Stream-Closed: {r}")
                    w.done = True
            elif r.status == 409 and r.h("Stream-Closed") == "true" and m.closing is not None and not close:
                # Lost the race with the close: refused, so certainly not stored.
                if w.producer:
                    w.next_seq -= 1
                w.done = True
            else:
                errors.append(f"{att}: unexpected response {r}")
                return

    async def load_and_kill(self, cycle: int) -> float:
        """Run all writers concurrently and SIGKILL the server at a random moment."""
        delay = self.kill_delays[cycle]
        errors: list[str] = []
        acked_before = self.stats["acked"]
        tasks = [asyncio.create_task(self._writer_loop(w, cycle, errors)) for w in self.writers if not w.done]
        await asyncio.sleep(delay)
        if self.server.proc is None or self.server.proc.poll() is not None:
            raise AssertionError(
                f"cycle {cycle}: the server died on its own during the load:\n{self.server.log()}"
            )
        self.server.kill()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        await self._close_session()
        assert not errors, "\n".join(errors)
        for w in self.writers:
            if w.in_flight is not None:
                self.streams[w.stream].candidates.append(w.in_flight)
                self.stats["in_flight"] += 1
        acked = self.stats["acked"] - acked_before
        self.log(f"cycle {cycle}: killed after {delay:.2f}s, {acked} appends acknowledged")
        assert acked >= 16, (
            f"cycle {cycle}: only {acked} appends acknowledged in {delay:.2f}s: is the server stuck?"
        )
        return delay

    # --------------------------------------------------------- verification

    async def verify_recovery(self, label: str) -> None:
        """After a restart: every stream is its old content + acked + whole in-flight appends."""
        await self.new_session()
        for m in self.streams:
            await self._verify_stream(m, label)
        for name, body, closed in self.extra:
            data, _, is_closed = await self.read_all(name)
            assert data == body, (
                f"{label}: stream {name} created with {len(body)} bytes reads back {len(data)}"
            )
            assert is_closed == closed, f"{label}: stream {name} closed={is_closed}, created closed={closed}"
            h = {"Content-Type": OCTET, **({"Stream-Closed": "true"} if closed else {})}
            r = await self.request("PUT", name, headers=h)
            assert r.status == 200, f"{label}: idempotent re-create of {name}: {r}"
        self.log(f"{label}: verified; totals {self.stats}")

    async def _verify_stream(self, m: StreamModel, label: str) -> None:
        data, token, closed = await self.read_all(m.name)
        where = f"{label}: stream {m.name}"
        old = len(m.content)
        if data[:old] != m.content:
            bad = next(
                (i for i in range(min(len(data), old)) if data[i] != m.content[i]), min(len(data), old)
            )
            owner = next((p for p in m.pieces if p.start is not None and p.start <= bad < p.end), None)
            raise AssertionError(
                f"{where}: history changed at byte {bad} (stream now {len(data)} bytes, was {old}); "
                f"that byte belongs to {owner}; now there: {describe_at(data, bad)}"
            )
        pending = sorted(m.pending, key=lambda a: a.start or 0)
        cands = list(m.candidates)
        pos = old
        order: list[Attempt] = []

        def fill_gap(until: int) -> None:
            nonlocal pos, cands
            gap = data[pos:until]
            found = decompose(gap, cands)
            if found is None:
                raise AssertionError(
                    f"{where}: bytes [{pos},{until}) are not whole unacknowledged appends; "
                    f"there: {describe_at(data, pos)}; in flight at the kill: {cands}"
                )
            for c in found:
                c.start, c.how = pos, "found"
                pos += len(c.payload)
                cands.remove(c)
                order.append(c)

        for a in pending:
            assert a.start is not None
            if a.start < pos:
                raise AssertionError(
                    f"{where}: acknowledged {a} overlaps the previous append ending at {pos}"
                )
            if a.end > len(data):
                raise AssertionError(
                    f"{where}: acknowledged {a} is missing: the stream has only {len(data)} bytes"
                )
            fill_gap(a.start)
            if data[a.start : a.end] != a.payload:
                raise AssertionError(
                    f"{where}: acknowledged {a} not byte-exact; there: {describe_at(data, a.start)}"
                )
            pos = a.end
            order.append(a)
        fill_gap(len(data))
        # A writer's in-flight request was its last: it cannot precede its own acknowledged appends.
        for c in m.candidates:
            if c.start is not None:
                later = [
                    a for a in order if a.writer == c.writer and a.start is not None and a.start > c.start
                ]
                assert not later, f"{where}: in-flight {c} stored before the same writer's later {later}"
        # The close is atomic with its final append, and nothing follows it.
        closing = m.closing
        if closed:
            assert closing is not None and closing.start is not None, (
                f"{where}: stream is closed but its closing append {closing} is not in it"
            )
            assert closing.end == len(data), f"{where}: data after the closing append {closing}"
        else:
            assert not m.closed, f"{where}: stream was closed before the crash but is open after the restart"
            assert closing is None or closing.start is None, (
                f"{where}: closing append {closing} is stored (or was acknowledged) but the stream is open"
            )
        m.closed = closed
        self.stats["found"] += sum(1 for c in m.candidates if c.start is not None)
        self.stats["lost"] += sum(1 for c in m.candidates if c.start is None)
        m.candidates = []
        m.pending = []
        m.pieces.extend(order)
        m.content = bytearray(data)
        m.tail_token = token
        m.tail = len(data)
        # Offset-addressed reads work after recovery: resume from a few acknowledged offsets.
        with_tokens = [p for p in m.pieces if p.end_token is not None]
        for p in self.rng.sample(with_tokens, min(3, len(with_tokens))):
            r = await self.request("GET", m.name, params={"offset": p.end_token})
            assert r.status == 200, f"{where}: GET offset={p.end_token}: {r}"
            assert r.body == data[p.end : p.end + len(r.body)], (
                f"{where}: read from {p.end_token} returned other bytes"
            )
            assert r.body or p.end == len(data), f"{where}: empty read from {p.end_token} before the tail"

    # ------------------------------------------------- after-restart checks

    async def post_restart_checks(self, cycle: int) -> None:
        """Retries, fencing, tail continuity, closing and creation; then check the suffix."""
        if self.session is None:
            await self.new_session()
        for w in self.writers:
            if w.producer:
                await self._retry_producer(w)
        await self._fencing_checks(cycle)
        for m in self.streams:
            await self._probe_tail(m, cycle)
        await self._create_extra(cycle)
        for m in self.streams:
            await self._check_suffix(m, f"after restart checks of cycle {cycle}")

    async def _post(self, w: Writer, att: Attempt) -> Response:
        return await self.request(
            "POST", self.streams[att.stream].name, data=att.payload, headers=w.headers(att)
        )

    async def _retry_producer(self, w: Writer) -> None:
        m = self.streams[w.stream]
        what = f"producer {w.producer_id} on {m.name}"
        inf = w.in_flight
        if m.closed:
            if m.closing is not None and m.closing.writer == w.wid and m.closing.start is not None:
                r = await self._post(w, m.closing)
                assert r.status == 204 and r.h("Stream-Closed") == "true", (
                    f"re-sent closing append of {what}: want 204 duplicate with Stream-Closed, got {r}"
                )
                assert parse_offset(r.h("Stream-Next-Offset") or "") == m.tail, r
            elif w.last_acked is not None:
                r = await self._post(w, w.last_acked)
                assert r.status == 409 and r.h("Stream-Closed") == "true", (
                    f"re-sent {w.last_acked} to closed stream: want 409 + Stream-Closed, got {r}"
                )
            w.in_flight = None
            w.done = True
            return
        expect_seq = inf.seq if inf is not None and inf.start is not None else None
        if w.last_acked is not None and w.last_acked.epoch == w.epoch:
            r = await self._post(w, w.last_acked)
            want_seq = expect_seq if expect_seq is not None else w.last_acked.seq
            assert r.status == 204, (
                f"re-sent last acknowledged {w.last_acked} of {what}: want 204 duplicate, got {r}"
            )
            assert r.h("Producer-Epoch") == str(w.epoch) and r.h("Producer-Seq") == str(want_seq), (
                f"duplicate of {w.last_acked}: want Producer-Epoch {w.epoch} Producer-Seq {want_seq}, got {r}"
            )
            assert parse_offset(r.h("Stream-Next-Offset") or "") == m.tail, f"duplicate moved the tail? {r}"
            assert r.h("Stream-Closed") is None, r
            self.stats["retried_204"] += 1
        if inf is not None:
            r = await self._post(w, inf)
            if inf.start is not None:  # it made it to disk before the kill
                assert r.status == 204, f"re-sent in-flight {inf} that is already stored: want 204, got {r}"
                assert r.h("Producer-Seq") == str(inf.seq), r
                assert parse_offset(r.h("Stream-Next-Offset") or "") == m.tail, (
                    f"duplicate moved the tail? {r}"
                )
                self.stats["retried_204"] += 1
            else:
                assert r.status == 200, f"re-sent in-flight {inf} that was lost: want 200 (new data), got {r}"
                self._record_ack(m, inf, r, "retry")
                assert inf.start == m.tail, f"retried {inf} not at the recovered tail {m.tail}"
                m.tail = inf.end
                self.stats["retried_200"] += 1
            if inf.close:
                assert r.h("Stream-Closed") == "true", f"re-sent append-and-close {inf}: {r}"
                m.closed = True
            w.last_acked, w.in_flight = inf, None
        if m.closed:
            w.done = True
            for other in self.writers:
                if other.stream == w.stream:
                    other.done = True
            return
        # The next sequence number is new data.
        att = w.new_attempt(pick_size(w.rng))
        r = await self._post(w, att)
        assert r.status == 200, f"next seq {att} of {what} after restart: want 200, got {r}"
        self._record_ack(m, att, r, "ack")
        assert att.start == m.tail, f"{att} not at the tail {m.tail}: offsets do not continue"
        m.tail = att.end
        w.last_acked = att

    async def _fencing_checks(self, cycle: int) -> None:
        w = self.bumped
        m = self.streams[w.stream]
        if self.bump_cycle is not None and cycle == self.bump_cycle and not m.closed:
            w.epoch += 1
            w.next_seq = 0
            att = w.new_attempt(pick_size(w.rng))
            r = await self._post(w, att)
            assert r.status == 200 and r.h("Producer-Epoch") == str(w.epoch), f"new epoch {att}: {r}"
            self._record_ack(m, att, r, "ack")
            assert att.start == m.tail, f"{att} not at the tail {m.tail}"
            m.tail = att.end
            w.last_acked = att
        if w.epoch > 0 and not m.closed:
            stale = Attempt(
                w.stream,
                w.wid,
                w.epoch - 1,
                STALE_WRITER_SEQ,
                make_payload(w.stream, w.wid, w.epoch - 1, STALE_WRITER_SEQ, 100),
                True,
            )
            r = await self._post(w, stale)
            assert r.status == 403 and r.h("Producer-Epoch") == str(w.epoch), (
                f"stale epoch {w.epoch - 1} after epoch {w.epoch} was acknowledged: want 403, got {r}"
            )
        # A sequence gap is refused and says which seq the server expects (its state survived).
        producers = [p for p in self.writers if p.producer and not self.streams[p.stream].closed]
        if producers:
            p = producers[cycle % len(producers)]
            gap = Attempt(
                p.stream,
                p.wid,
                p.epoch,
                p.next_seq + 1,
                make_payload(p.stream, p.wid, p.epoch, p.next_seq + 1, 50),
                True,
            )
            r = await self._post(p, gap)
            assert r.status == 409, f"seq gap {gap}: want 409, got {r}"
            assert r.h("Producer-Expected-Seq") == str(p.next_seq), f"seq gap {gap}: {r}"
            assert r.h("Producer-Received-Seq") == str(p.next_seq + 1), f"seq gap {gap}: {r}"

    async def _probe_tail(self, m: StreamModel, cycle: int) -> None:
        """A plain append lands exactly at the tail (or a closed stream refuses it)."""
        self.probe.stream = m.index
        att = self.probe.new_attempt(self.probe.rng.randint(1, 2 * KiB))
        r = await self.request("POST", m.name, data=att.payload, headers={"Content-Type": OCTET})
        if m.closed:
            assert r.status == 409 and r.h("Stream-Closed") == "true", f"append to closed {m.name}: {r}"
            assert parse_offset(r.h("Stream-Next-Offset") or "") == m.tail, r
            r = await self.request("PUT", m.name, headers={"Content-Type": OCTET})
            assert r.status == 409, f"PUT without Stream-Closed on closed {m.name}: {r}"
            r = await self.request("POST", m.name, headers={"Stream-Closed": "true"})
            assert r.status == 204 and r.h("Stream-Closed") == "true", f"idempotent close of {m.name}: {r}"
            return
        assert r.status == 204, f"probe append {att} to {m.name}: {r}"
        self._record_ack(m, att, r, "ack")
        assert att.start == m.tail, f"probe {att} on {m.name}: offsets do not continue from the tail {m.tail}"
        m.tail = att.end

    async def _create_extra(self, cycle: int) -> None:
        name = f"crash-{self.seed}-extra{cycle}"
        closed = cycle % 2 == 1
        body = make_payload(0, CREATE_WRITER, 0, cycle, 100 + 997 * cycle)
        h = {"Content-Type": OCTET, **({"Stream-Closed": "true"} if closed else {})}
        r = await self.request("PUT", name, data=body, headers=h)
        assert r.status == 201, f"create {name}: {r}"
        assert parse_offset(r.h("Stream-Next-Offset") or "") == len(body), r
        assert (r.h("Stream-Closed") == "true") == closed, r
        self.extra.append((name, body, closed))

    async def _check_suffix(self, m: StreamModel, label: str) -> None:
        """Everything since the verified tail is exactly the acknowledged appends, once each."""
        data, token, closed = await self.read_all(m.name, m.tail_token)
        pending = sorted(m.pending, key=lambda a: a.start or 0)
        expect = b"".join(a.payload for a in pending)
        pos = len(m.content)
        for a in pending:
            assert a.start == pos, f"{label}: {m.name}: {a} not contiguous at {pos}"
            pos = a.end
        assert data == expect, (
            f"{label}: {m.name}: after the verified tail the stream has {len(data)} bytes "
            f"({describe_at(data, 0)}), expected {len(expect)} bytes of {pending}"
        )
        assert closed == m.closed, f"{label}: {m.name}: closed={closed}, expected {m.closed}"
        r = await self.request("HEAD", m.name)
        assert r.status == 200 and parse_offset(r.h("Stream-Next-Offset") or "") == pos, f"HEAD {m.name}: {r}"
        assert (r.h("Stream-Closed") == "true") == m.closed, f"HEAD {m.name}: {r}"
        m.content += data
        m.pieces.extend(pending)
        m.pending = []
        m.tail_token = token
        m.tail = pos
