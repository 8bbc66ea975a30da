"""Black-box tests of the cold tier: real ``tiered serve`` processes over HTTP.

* Local store, aggressive flushing: many streams (binary of varied sizes, JSON,
  a fork, a non-default bucket) are written, flushed until the old hot segments
  are gone, and read back byte-exact; again after a clean restart and after a
  SIGKILL, with appends after each restart continuing the offsets.
* The Parquet objects under ``<data-dir>/cold/data`` hold exactly the served
  bytes of every stream, with the documented schema.
* Packing: a thousand quiet streams cost one or two objects, not a thousand.
* S3: the same round trip with the data served from S3, on every S3 store of
  ``tests/support/s3_backends.py`` (moto; moto with IAM enforced, as a user holding only the
  policy ``terraform/iam.tf`` grants; Ceph RGW over HTTP and over HTTPS).
* S3 outage: appends are accepted until the hot cap, then 503 + Retry-After;
  cold-only reads fail promptly with 503; once S3 is back, flushing resumes and
  every acknowledged byte is readable.

While waiting for old segments to disappear the tests keep appending small
"tick" records (a server that is not idle) and pass a small
``--snapshot-every-bytes``: hot segments are only deleted behind the oldest kept
snapshot, so the replay floor has to move for them to go (on an idle server it
does not: see ``test_idle_server_frees_sealed_segments_once_their_data_is_cold``
in ``tests/engine/jobs/test_cold_flusher_unit.py``).
"""

from __future__ import annotations

import json
import math
import random
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import botocore.config
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from moto.server import ThreadedMotoServer

from tests.support import s3_backends, s3_server
from tests.support.deadlines import Deadline, scaled
from tests.support.http_helpers import request
from tests.support.server_process import ServerProcess, free_port
from tiered.core.ids import format_offset, parse_offset

MiB = 1024 * 1024
OCTET = "application/octet-stream"
JSON = "application/json"
SCHEMA = pa.schema(  # the documented cold-object format: every column REQUIRED
    [
        pa.field("bucket", pa.string(), nullable=False),
        pa.field("stream", pa.string(), nullable=False),
        pa.field("incarnation", pa.int64(), nullable=False),
        pa.field("start_offset", pa.int64(), nullable=False),
        pa.field("end_offset", pa.int64(), nullable=False),
        pa.field("append_time_ms", pa.int64(), nullable=False),
        pa.field("payload", pa.binary(), nullable=False),
    ]
)
FAST_FLUSH = [
    "--flush-interval-s",
    "0.05",
    "--hot-retention-s",
    "0",
    "--segment-bytes",
    str(MiB),
    "--max-body-bytes",
    "500000",
    "--read-chunk-bytes",
    str(MiB),  # reads of the bigger streams take several requests
    "--cold-object-bytes",
    str(MiB),  # big streams get objects of their own, split at record boundaries
    "--snapshot-every-bytes",
    "4096",  # see the module docstring
]
SIZES = [1, 7, 100, 1_000, 4_096, 30_000, 120_000, 499_999]
SIZE_WEIGHTS = [3, 3, 4, 4, 4, 4, 3, 1]

# --------------------------------------------------------------------------- model of what was acknowledged


@dataclass
class Model:
    """What the server acknowledged for one stream."""

    name: str
    bucket: str = "default"
    json: bool = False
    fork_offset: int = 0
    inherited_messages: int = 0  # JSON forks: messages that live in the source
    data: bytearray = field(
        default_factory=bytearray
    )  # binary: every byte from offset 0 (fork prefix included)
    messages: list[Any] = field(default_factory=list)  # JSON streams
    tail: int = 0  # the last Stream-Next-Offset the server returned

    def url(self, base: str) -> str:
        if self.bucket == "default":
            return f"{base}/v1/stream/{self.name}"
        return f"{base}/v1/buckets/{self.bucket}/stream/{self.name}"

    @property
    def path(self) -> str:
        return self.url("")

    def expected(self) -> bytes | list[Any]:
        return self.messages if self.json else bytes(self.data)


def create(base: str, m: Model, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
    status, h, resp = request(
        "PUT", m.url(base), {"Content-Type": JSON if m.json else OCTET, **(headers or {})}, body
    )
    assert status == 201, (m.name, status, resp)
    m.tail = parse_offset(h["Stream-Next-Offset"]) or 0
    if m.json:
        m.messages.extend(json.loads(body) if body else [])
    else:
        m.data += body
        assert m.tail == m.fork_offset + len(body)


def append(base: str, m: Model, body: bytes | Any, *, expect: int = 204) -> tuple[int, Any]:
    """POST one record; on success check the offset continues exactly and update the model."""
    raw = json.dumps(body).encode() if m.json else body
    status, h, resp = request(
        "POST", m.url(base), {"Content-Type": JSON if m.json else OCTET}, raw, timeout=30
    )
    if status != 204:
        assert status == expect, (m.name, status, resp)
        return status, h
    new_tail = parse_offset(h["Stream-Next-Offset"])
    assert new_tail is not None
    if m.json:
        assert new_tail > m.tail, (m.name, m.tail, new_tail)
        m.messages.extend(body if isinstance(body, list) else [body])
    else:
        assert new_tail == m.tail + len(body), (m.name, m.tail, len(body), new_tail)
        m.data += body
    m.tail = new_tail
    return status, h


def read_stream(base: str, m: Model, *, timeout: float = 30.0) -> tuple[bytes | list[Any], int]:
    """Catch-up read from the start, following Stream-Next-Offset; returns (content, tail)."""
    offset = "-1"
    out = bytearray()
    messages: list[Any] = []
    for _ in range(10_000):
        status, h, body = request("GET", f"{m.url(base)}?offset={offset}", timeout=timeout)
        assert status == 200, (m.name, offset, status, body[:300])
        if m.json:
            messages.extend(json.loads(body))
        else:
            out += body
        offset = h["Stream-Next-Offset"]
        if h.get("Stream-Up-To-Date") == "true":
            return (messages if m.json else bytes(out)), parse_offset(offset) or 0
    raise AssertionError(f"{m.name}: never up to date")


def check_reads(base: str, models: Iterable[Model]) -> None:
    for m in models:
        content, tail = read_stream(base, m)
        assert tail == m.tail, (m.name, tail, m.tail)
        if m.json:
            assert content == m.messages, m.name
        else:
            assert len(content) == len(m.data), (m.name, len(content), len(m.data))
            assert content == bytes(m.data), f"{m.name}: content differs"


def random_record(rng: random.Random) -> bytes:
    return rng.randbytes(rng.choices(SIZES, SIZE_WEIGHTS)[0])


def write_concurrently(jobs: dict[str, Callable[[], None]], threads: int = 8) -> None:
    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(job) for job in jobs.values()]:
            future.result()


# --------------------------------------------------------------------------- cold objects


Rows = dict[tuple[str, str], list[tuple[int, int, bytes]]]


def local_tables(data_dir: Path) -> list[tuple[str, pa.Table]]:
    return [(p.name, pq.read_table(p)) for p in sorted((data_dir / "cold" / "data").glob("*.parquet"))]


def s3_tables(client: Any, bucket: str, prefix: str) -> list[tuple[str, pa.Table]]:
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/data/"):
        for item in page.get("Contents", []):
            body = client.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
            out.append((item["Key"], pq.read_table(pa.BufferReader(body))))
    return out


def rows_by_stream(tables: Iterable[tuple[str, pa.Table]]) -> Rows:
    rows: Rows = {}
    for _, table in tables:
        cols = table.to_pydict()
        for b, s, start, end, payload in zip(
            cols["bucket"],
            cols["stream"],
            cols["start_offset"],
            cols["end_offset"],
            cols["payload"],
            strict=True,
        ):
            rows.setdefault((b, s), []).append((start, end, payload))
    for v in rows.values():
        v.sort()
    return rows


def cold_content(m: Model, rows: Rows) -> bytes | list[Any] | None:
    """The stream's own data as the cold objects hold it (None unless complete and contiguous)."""
    mine = rows.get((m.bucket, m.name), [])
    pos = m.fork_offset
    parts = []
    for start, end, payload in mine:
        if start != pos or end - start != len(payload):
            return None
        parts.append(payload)
        pos = end
    if pos != m.tail:
        return None
    data = b"".join(parts)
    if m.json:
        return [json.loads(line) for line in data.splitlines()]
    return data


def own_expected(m: Model) -> bytes | list[Any]:
    return m.messages[m.inherited_messages :] if m.json else bytes(m.data[m.fork_offset :])


def all_cold(models: Iterable[Model], rows: Rows) -> bool:
    return all(cold_content(m, rows) == own_expected(m) for m in models)


def wait(
    cond: Callable[[], bool],
    timeout: float,
    what: str,
    tick: Callable[[], None] | None = None,
    explain: Callable[[], str] | None = None,
) -> float:
    """Until ``cond()``, ticking meanwhile; ``timeout`` is for an idle machine (``deadlines.scaled``)."""
    started = time.monotonic()
    deadline = Deadline(timeout)
    while not cond():
        if deadline.expired():
            raise AssertionError(
                f"timed out after {deadline} waiting for {what}" + (f": {explain()}" if explain else "")
            )
        if tick is not None:
            tick()
        time.sleep(0.1)
    return time.monotonic() - started


def segment_ids(data_dir: Path) -> list[int]:
    return sorted(int(p.stem) for p in (data_dir / "hot").glob("*.seg"))


def wait_until_cold(
    srv: ServerProcess,
    models: list[Model],
    ticker: Model,
    tables: Callable[[], list[tuple[str, pa.Table]]],
    timeout: float = 45.0,
) -> None:
    """Until every sealed hot segment is deleted and the cold objects hold every stream's data."""
    newest = segment_ids(srv.data_dir)[-1]
    rng = random.Random(7)

    def tick() -> None:
        append(srv.url, ticker, rng.randbytes(4_096))

    def done() -> bool:
        segs = segment_ids(srv.data_dir)
        if len(segs) != 1 or segs[0] < newest:
            return False
        return all_cold([m for m in models if m is not ticker], rows_by_stream(tables()))

    def explain() -> str:
        rows = rows_by_stream(tables())
        missing = [m.name for m in models if m is not ticker and cold_content(m, rows) != own_expected(m)]
        return f"segments {segment_ids(srv.data_dir)} (newest after writing: {newest}); not cold: {missing}"

    wait(done, timeout, "old hot segments to be deleted and all data to be cold", tick, explain)


# --------------------------------------------------------------------------- 1 + 2: local store


@dataclass
class Cluster:
    srv: ServerProcess
    models: list[Model]
    ticker: Model


def populate(srv: ServerProcess, *, seed: int, binary: int, json_streams: int, records: int) -> list[Model]:
    """Many streams with varied data, a fork taken halfway and a stream in another bucket."""
    rng = random.Random(seed)
    base = srv.url
    status, _, body = request("PUT", f"{base}/v1/buckets/cold-bucket")
    assert status in (200, 201), body
    models = [Model(f"bin-{i:02d}" if i % 3 else f"nested/path/bin-{i:02d}") for i in range(binary)]
    models += [Model(f"json-{i}", json=True) for i in range(json_streams)]
    models.append(Model("other-bucket-stream", bucket="cold-bucket"))
    for i, m in enumerate(models):
        if m.json:
            create(base, m, json.dumps([{"i": i, "created": True}]).encode())
        else:
            create(base, m, rng.randbytes(rng.choice([0, 10, 5_000])))

    def writer(m: Model, n: int, seed: int) -> Callable[[], None]:
        def run() -> None:
            r = random.Random(seed)
            for k in range(n):
                if m.json:
                    append(
                        base,
                        m,
                        [{"k": k, "s": "é\n\u2603" * r.randrange(5), "v": r.random()}] * r.randrange(1, 4),
                    )
                else:
                    append(base, m, random_record(r))

        return run

    per_stream = max(1, records // len(models))
    half = {m.name: writer(m, per_stream // 2, rng.randrange(1 << 30)) for m in models}
    write_concurrently(half)
    # Fork the first binary stream halfway, then keep writing to both.
    source = models[0]
    fork = Model("fork-of-bin-00", fork_offset=len(source.data) // 2)
    fork.data = bytearray(source.data[: fork.fork_offset])
    create(
        base,
        fork,
        b"",
        {"Stream-Forked-From": source.path, "Stream-Fork-Offset": format_offset(fork.fork_offset)},
    )
    models.append(fork)
    rest = {m.name: writer(m, per_stream - per_stream // 2, rng.randrange(1 << 30)) for m in models}
    write_concurrently(rest)
    return models


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    srv = ServerProcess(tmp_path_factory.mktemp("cold-local") / "data", *FAST_FLUSH).start()
    try:
        models = populate(srv, seed=20251202, binary=24, json_streams=3, records=420)
        ticker = Model("ticks")
        create(srv.url, ticker)
        models.append(ticker)
        total = sum(len(m.data) - m.fork_offset for m in models)
        assert total > 10 * MiB, total
        # Segments rolled (their ids count from 1). How many sealed ones are still on disk is a race
        # with the flusher, which deletes them once cold: on a loaded machine it keeps up and leaves one.
        assert segment_ids(srv.data_dir)[-1] > 1, segment_ids(srv.data_dir)
        wait_until_cold(srv, models, ticker, lambda: local_tables(srv.data_dir))
        yield Cluster(srv, models, ticker)
    finally:
        srv.stop()


def test_parquet_objects_hold_exactly_the_served_bytes(local_cluster: Cluster) -> None:
    srv, models = local_cluster.srv, local_cluster.models
    served = {}
    for m in models:
        content, tail = read_stream(srv.url, m)
        assert tail == m.tail
        served[m.name] = content
    # The last ticks may still be on their way to the cold tier.
    wait(lambda: all_cold(models, rows_by_stream(local_tables(srv.data_dir))), 20, "every stream to be cold")
    tables = local_tables(srv.data_dir)
    assert tables
    for name, table in tables:
        assert table.schema.names == SCHEMA.names, name
        assert table.schema.equals(SCHEMA, check_metadata=False), (name, table.schema)
        assert table.num_rows > 0
        cols = table.to_pydict()
        # No record is bigger than the target, so no object holds more than --cold-object-bytes.
        assert sum(map(len, cols["payload"])) <= MiB, name
        for start, end, payload, ts in zip(
            cols["start_offset"], cols["end_offset"], cols["payload"], cols["append_time_ms"], strict=True
        ):
            assert end - start == len(payload), name
            assert abs(ts - time.time() * 1000) < 3_600_000, ts  # epoch milliseconds
        assert set(cols["incarnation"]) == {0}, name  # every path here holds its first stream
    rows = rows_by_stream(tables)
    # Every stream with data of its own, and no other: the ticker holds none when the flusher had done its
    # work before the wait's first look (a loaded run met that), so it never ticked.
    holding = {(m.bucket, m.name) for m in models if own_expected(m)}
    assert set(rows) == holding, "cold objects hold unknown or missing streams"
    assert len(holding) >= len(models) - 1  # only the ticker may be empty
    assert ("default", "nested/path/bin-00") in rows and ("cold-bucket", "other-bucket-stream") in rows
    for m in models:
        mine = rows[(m.bucket, m.name)]
        assert mine[0][0] == m.fork_offset, m.name
        for (_, end, _), (start, _, _) in zip(mine, mine[1:], strict=False):
            assert end == start, f"{m.name}: gap or overlap at {end}/{start}"
        concatenated = b"".join(p for _, _, p in mine)
        if m.json:
            assert concatenated.endswith(b"\n")
            own = served[m.name][m.inherited_messages :]
            assert [json.loads(line) for line in concatenated.splitlines()] == own, m.name
        else:
            # A fork's objects hold only its own bytes; the prefix is its source's.
            assert concatenated == served[m.name][m.fork_offset :], m.name
            assert mine[-1][1] == len(served[m.name])


def fork_cold_streams(base: str, models: list[Model]) -> list[Model]:
    """Forks whose fork point has to be found in (and whose prefix is read from) cold data."""
    json_source = next(m for m in models if m.json)
    json_fork = Model("fork-of-json-after-restart", json=True)
    json_fork.messages = json_source.messages[:3]
    json_fork.inherited_messages = 3
    create(
        base,
        json_fork,
        b"",
        {
            "Stream-Forked-From": json_source.path,
            "Stream-Fork-Offset": format_offset(0),
            "Stream-Fork-Sub-Offset": "3",
        },
    )
    json_fork.fork_offset = json_fork.tail
    bin_source = next(m for m in models if not m.json and m.fork_offset == 0 and len(m.data) > 100_000)
    bin_fork = Model("fork-of-cold-bin-after-restart", fork_offset=len(bin_source.data) // 3)
    bin_fork.data = bytearray(bin_source.data[: bin_fork.fork_offset])
    create(
        base,
        bin_fork,
        b"",
        {"Stream-Forked-From": bin_source.path, "Stream-Fork-Offset": format_offset(bin_fork.fork_offset)},
    )
    return [json_fork, bin_fork]


def test_round_trip_survives_clean_restart_and_sigkill(local_cluster: Cluster) -> None:
    srv, models = local_cluster.srv, local_cluster.models
    rng = random.Random(99)
    check_reads(srv.url, models)
    targets = models[::4] + [m for m in models if m.name == "fork-of-bin-00"]

    def more_appends() -> None:
        for m in targets:
            for _ in range(3):
                append(srv.url, m, [{"after": "restart"}] if m.json else random_record(rng))

    assert srv.stop() == 0, srv.log()
    srv.start()
    check_reads(srv.url, models)
    forks = fork_cold_streams(srv.url, models)
    models.extend(forks)
    targets.extend(forks)
    more_appends()
    check_reads(srv.url, models)

    srv.kill()
    srv.start()
    check_reads(srv.url, models)
    more_appends()
    check_reads(srv.url, models)
    # The new data goes cold too, and survives another kill.
    wait_until_cold(srv, models, local_cluster.ticker, lambda: local_tables(srv.data_dir))
    srv.kill()
    srv.start()
    check_reads(srv.url, models)


# --------------------------------------------------------------------------- 3: packing


def test_a_thousand_small_streams_are_packed_into_one_or_two_objects(tmp_path: Path) -> None:
    srv = ServerProcess(tmp_path / "data", "--flush-interval-s", "1").start()
    try:
        models = [Model(f"quiet/{i:04d}") for i in range(1_000)]
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda m: create(srv.url, m), models))
            rng = random.Random(3)
            payloads = [rng.randbytes(100) for _ in models]
            started = time.monotonic()
            list(pool.map(lambda mp: append(srv.url, mp[0], mp[1]), zip(models, payloads, strict=True)))
            window = time.monotonic() - started
        total = 100 * len(models)
        wait(
            lambda: all_cold(models, rows_by_stream(local_tables(srv.data_dir))), 15, "all streams to be cold"
        )
        tables = local_tables(srv.data_dir)
        print(f"1,000 x 100 B appended in {window:.2f}s -> {len(tables)} cold object(s)")
        target = 16 * MiB  # the default --cold-object-bytes
        assert math.ceil(total / target) == 1
        # One object per flush pass that found data: 1, or 2 if a pass ran while we were writing.
        passes_during_writes = math.ceil(window / 1.0)
        assert 1 <= len(tables) <= max(2, passes_during_writes + 1), (len(tables), window)
        assert len(tables) <= 2 or window > 1.0
        assert sum(t.num_rows for _, t in tables) == len(models)
        assert sum(len(p) for _, t in tables for p in t.column("payload").to_pylist()) == total
        assert max(t.num_rows for _, t in tables) >= len(models) // 2
        check_reads(srv.url, models[::50])
    finally:
        srv.stop()


def test_flush_bytes_flushes_early(tmp_path: Path) -> None:
    srv = ServerProcess(
        tmp_path / "data", "--flush-interval-s", "30", "--flush-bytes", "262144", "--hot-retention-s", "0"
    ).start()
    try:
        m = Model("kicked")
        create(srv.url, m)
        append(srv.url, m, random.Random(11).randbytes(300_000))  # 300,000 >= 262,144 bytes waiting
        # "flush early once this many bytes are waiting": well before the 30 s interval.
        wait(lambda: all_cold([m], rows_by_stream(local_tables(srv.data_dir))), 3, "an early flush")
        check_reads(srv.url, [m])
    finally:
        srv.stop()


# --------------------------------------------------------------------------- 4: S3


def s3_args(endpoint: str, bucket: str, prefix: str) -> list[str]:
    return [
        "--cold-store",
        "s3",
        "--s3-bucket",
        bucket,
        "--s3-prefix",
        prefix,
        "--s3-endpoint",
        endpoint,
        "--s3-region",
        s3_server.REGION,
        "--s3-addressing-style",
        "path",
    ]


def s3_env() -> dict[str, str]:
    """Fake credentials through the standard AWS environment chain (nothing on the command line)."""
    return dict(s3_server._TEST_ENV)


@pytest.mark.parametrize("s3_backend", s3_backends.ALL, indirect=True)
def test_s3_round_trip_serves_cold_data_from_the_bucket(
    s3_backend: s3_backends.S3Backend, tmp_path: Path
) -> None:
    """Every S3 store (moto, moto as an IAM user with iam.tf's policy, Ceph RGW over HTTP and HTTPS)."""
    srv = ServerProcess(tmp_path / "data", *FAST_FLUSH, *s3_backend.serve_args(), env=s3_backend.env)
    srv.start()
    try:
        models = populate(srv, seed=4, binary=8, json_streams=1, records=130)
        ticker = Model("ticks")
        create(srv.url, ticker)
        models.append(ticker)
        assert sum(len(m.data) - m.fork_offset for m in models) > 2 * MiB
        client = s3_backend.client()
        tables = lambda: s3_tables(client, s3_backend.bucket, s3_backend.prefix)  # noqa: E731
        wait_until_cold(srv, models, ticker, tables)
        keys = [k for k, _ in tables()]
        assert keys and all(
            k.startswith(f"{s3_backend.prefix}/data/") and k.endswith(".parquet") for k in keys
        ), keys
        assert not (srv.data_dir / "cold" / "data").exists(), "cold objects went to the local store"
        check_reads(srv.url, models)
        assert srv.stop() == 0, srv.log()
        srv.start()
        check_reads(srv.url, models)
    finally:
        srv.stop()


# --------------------------------------------------------------------------- 5: S3 outage


class RestartableMoto:
    """A moto S3 server that can be stopped and started again on the same port.

    moto keeps its backends in process memory, so a new server on the same port
    sees the same buckets and objects (the test checks that first).
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.server: ThreadedMotoServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        deadline = time.monotonic() + scaled(10)
        while True:  # ThreadedMotoServer.start() would hang forever on EADDRINUSE
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("127.0.0.1", self.port))
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
            time.sleep(0.05)
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()  # closes the listening socket: connections are refused
            self.server = None


def test_s3_outage_caps_hot_data_fails_cold_reads_fast_and_recovers(
    aws_test_env: None, tmp_path: Path
) -> None:
    bucket = "tiered-outage"
    moto = RestartableMoto()
    moto.start()
    srv: ServerProcess | None = None
    try:
        client = boto3.client("s3", endpoint_url=moto.url, region_name=s3_server.REGION)
        client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key="probe", Body=b"kept")
        moto.stop()
        with pytest.raises(Exception):  # noqa: B017 - any connection error
            boto3.client(
                "s3",
                endpoint_url=moto.url,
                region_name=s3_server.REGION,
                config=botocore.config.Config(retries={"total_max_attempts": 1}, connect_timeout=1),
            ).list_buckets()
        moto.start()
        assert bucket in [b["Name"] for b in client.list_buckets()["Buckets"]]
        assert client.get_object(Bucket=bucket, Key="probe")["Body"].read() == b"kept"

        srv = ServerProcess(
            tmp_path / "data",
            *FAST_FLUSH,
            *s3_args(moto.url, bucket, "outage"),
            "--max-hot-bytes",
            "200000",
            env=s3_env(),
        ).start()
        rng = random.Random(5)
        cold = Model("cold-only")
        create(srv.url, cold)
        for _ in range(15):
            append(srv.url, cold, rng.randbytes(10_000))
        wait(
            lambda: all_cold([cold], rows_by_stream(s3_tables(client, bucket, "outage"))),
            20,
            "cold-only in S3",
        )
        time.sleep(0.5)  # the hot copies are trimmed right after the commit, in the same pass

        moto.stop()
        hot = Model("written-during-outage")
        create(srv.url, hot)
        accepted = 0
        for _ in range(40):
            status, headers = append(srv.url, hot, rng.randbytes(10_000), expect=503)
            if status == 503:
                assert headers.get("Retry-After"), "503 without Retry-After"
                break
            accepted += 1
        else:
            raise AssertionError("appends were never refused although S3 is down")
        assert accepted == 20, accepted  # exactly --max-hot-bytes worth of 10,000-byte appends
        check_reads(srv.url, [hot])  # hot data stays readable

        started = time.monotonic()
        status, headers, body = request("GET", cold.url(srv.url) + "?offset=-1", timeout=30)
        elapsed = time.monotonic() - started
        print(f"cold read during the S3 outage: {status} after {elapsed:.2f}s")
        assert status == 503, (status, body[:200])
        assert headers.get("Retry-After")
        assert elapsed < 30

        moto.start()
        back = time.monotonic()
        deadline = back + scaled(60)
        while True:
            status, headers = append(srv.url, hot, rng.randbytes(10_000), expect=503)
            if status == 204:
                break
            assert time.monotonic() < deadline, "appends never accepted again after S3 came back"
            time.sleep(min(float(headers.get("Retry-After", "1")), 0.5))
        print(f"appends accepted again {time.monotonic() - back:.2f}s after S3 came back")
        # The hot tier drains as the flusher copies the outage's data out, pass by pass: until it
        # has, an append may still meet the cap (503 + Retry-After, nothing written), as above.
        for _ in range(5):
            while True:
                status, headers = append(srv.url, hot, rng.randbytes(10_000), expect=503)
                if status == 204:
                    break
                assert headers.get("Retry-After"), "503 without Retry-After"
                assert time.monotonic() < deadline, "the hot tier never drained after S3 came back"
                time.sleep(min(float(headers.get("Retry-After", "1")), 0.5))
        check_reads(srv.url, [cold, hot])
        wait(
            lambda: all_cold([cold, hot], rows_by_stream(s3_tables(client, bucket, "outage"))),
            30,
            "data written during the outage to reach S3",
        )
        check_reads(srv.url, [cold, hot])
    finally:
        if srv is not None:
            srv.stop()
        moto.stop()
