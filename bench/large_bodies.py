#!/usr/bin/env python3
"""Server memory while a large body is appended by reference and read back (issue 22).

Starts ``tiered serve`` (local store, default large-body settings: threshold
8 MiB, reads of up to ``read_chunk_bytes``) on a loopback port, appends one
body of ``--size`` bytes with a declared ``Content-Length`` (streamed from a
generator: the client never holds it either), then reads the stream back with
catch-up reads following ``Stream-Next-Offset``, checking a CRC32C of every
byte against the one sent. A thread samples the server's RSS (``/proc``)
every 20 ms; the figures are its baseline (idle, after start), its peak while
appending and while reading, and the kernel's high-water mark.

    python bench/large_bodies.py --size 2GiB
    python bench/large_bodies.py --size 2GiB --http-server aiohttp
    python bench/large_bodies.py --size 512MiB --moto    # S3 multipart, against moto on loopback

Bounded: one append and at most size / read_chunk_bytes + 2 reads, on loopback.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import google_crc32c

MiB = 1024 * 1024


def parse_size(text: str) -> int:
    units = {"gib": 1024 * MiB, "mib": MiB, "kib": 1024, "": 1}
    lower = text.lower()
    for unit, factor in units.items():
        if unit and lower.endswith(unit):
            return int(float(lower[: -len(unit)]) * factor)
    return int(lower)


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


class Sampler:
    """The server's RSS every 20 ms; ``peak()`` since the last ``reset()``."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self._peak = max(self._peak, rss_kib(self.pid))
            except OSError:
                return

    def reset(self) -> None:
        self._peak = rss_kib(self.pid)

    def peak(self) -> int:
        return self._peak

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def body(size: int) -> Iterator[bytes]:
    """``size`` bytes in 1 MiB pieces, each one different (its index in its first bytes)."""
    block = bytearray(os.urandom(MiB))
    sent = 0
    n = 0
    while sent < size:
        block[:8] = n.to_bytes(8, "big")
        piece = bytes(block[: min(MiB, size - sent)])
        sent += len(piece)
        n += 1
        yield piece


def start_moto() -> tuple[object, list[str], dict[str, str]]:
    """moto's S3 on a loopback port (a dev dependency), a bucket on it: the server's args and environment."""
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    s3 = boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id="testing",
                      aws_secret_access_key="testing")  # fmt: skip
    s3.create_bucket(Bucket="bench")
    args = ["--cold-store", "s3", "--s3-bucket", "bench", "--s3-endpoint", url, "--s3-region", "us-east-1",
            "--s3-addressing-style", "path"]  # fmt: skip
    return server, args, env


def start_server(
    data_dir: Path, port: int, http_server: str, extra: list[str], env: dict[str, str]
) -> subprocess.Popen[bytes]:
    cmd = [
        sys.executable, "-m", "tiered.cli", "serve",
        "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir),
        "--http-server", http_server, *extra,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env={**os.environ, **env},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1) as resp:
                if resp.status == 200:
                    return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not start")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2GiB", help="body size (e.g. 2GiB, 512MiB)")
    ap.add_argument("--http-server", default="granian", choices=("granian", "aiohttp"))
    ap.add_argument("--data-dir", default="", help="where the server keeps its data (default: a temp dir)")
    ap.add_argument("--moto", action="store_true", help="store on moto's S3 (multipart uploads) on loopback")
    args = ap.parse_args()
    size = parse_size(args.size)
    tmp = Path(args.data_dir or tempfile.mkdtemp(prefix="tiered-large-"))
    port = free_port()
    moto, extra, env = start_moto() if args.moto else (None, [], {})
    proc = start_server(tmp / "data", port, args.http_server, extra, env)
    sampler = Sampler(proc.pid)
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
        conn.request("PUT", "/v1/stream/big", b"", {"Content-Type": "application/octet-stream"})
        assert conn.getresponse().read() is not None
        time.sleep(1.0)
        baseline = rss_kib(proc.pid)
        sampler.reset()

        crc = 0
        started = time.monotonic()
        conn.putrequest("POST", "/v1/stream/big")
        conn.putheader("Content-Type", "application/octet-stream")
        conn.putheader("Content-Length", str(size))
        conn.endheaders()
        for piece in body(size):
            crc = google_crc32c.extend(crc, piece)
            conn.send(piece)
        resp = conn.getresponse()
        resp.read()
        append_s = time.monotonic() - started
        assert resp.status == 204, resp.status
        append_peak = sampler.peak()

        sampler.reset()
        started = time.monotonic()
        offset, got, back, reads = "-1", 0, 0, 0
        while True:
            conn.request("GET", f"/v1/stream/big?offset={offset}")
            r = conn.getresponse()
            data = r.read()
            assert r.status == 200, (r.status, data[:200])
            reads += 1
            back = google_crc32c.extend(back, data)
            got += len(data)
            offset = r.headers["Stream-Next-Offset"]
            if r.headers.get("Stream-Up-To-Date") == "true":
                break
        read_s = time.monotonic() - started
        read_peak = sampler.peak()
        hwm = rss_kib(proc.pid, "VmHWM")
        ok = got == size and back == crc
        store = "moto S3 (multipart)" if args.moto else "local directory"
        print(f"body: {size / MiB:.0f} MiB, http server {args.http_server}, store {store}, byte-exact: {ok}")
        print(f"server RSS baseline (idle): {baseline / 1024:.0f} MiB")
        print(
            f"append: {append_s:.1f} s ({size / MiB / append_s:.0f} MiB/s); peak RSS {append_peak / 1024:.0f} MiB "
            f"(+{(append_peak - baseline) / 1024:.0f} MiB)"
        )
        print(
            f"read:   {read_s:.1f} s ({size / MiB / read_s:.0f} MiB/s, {reads} reads); peak RSS "
            f"{read_peak / 1024:.0f} MiB (+{(read_peak - baseline) / 1024:.0f} MiB)"
        )
        print(f"server RSS high-water mark (whole run): {hwm / 1024:.0f} MiB")
        if not ok:
            raise SystemExit("the body read back is not the body sent")
    finally:
        sampler.stop()
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if not args.data_dir:
            shutil.rmtree(tmp, ignore_errors=True)
        if moto is not None:
            moto.stop()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
