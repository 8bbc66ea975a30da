#!/usr/bin/env python3
"""A do-nothing HTTP server on either of tiered's HTTP stacks: the ceiling for appends.

Every request's body is read and answered ``204`` with a ``Stream-Next-Offset``
header, through the same adapter tiered uses (``tiered.api.kit.rsgi_server`` or
``tiered.api.kit.aiohttp_server``) and uvloop, so ``bench/compare.py`` can put
tiered beside the fastest a server on that stack could possibly answer:
the gap is the cost of the protocol, the journal and fsync.

    python bench/null_server.py --stack granian --port 4438
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tiered.api.kit.types import Request, Response  # noqa: E402


async def nothing(request: Request) -> Response:
    await request.body()
    # 201 for the benchmark's stream creation (PUT), 204 for every append.
    return Response(
        201 if request.method == "PUT" else 204, {"Stream-Next-Offset": "0000000000000000_0000000000000000"}
    )


async def main(stack: str, host: str, port: int) -> None:
    listener: object
    if stack == "granian":
        from tiered.api.kit.rsgi_server import RsgiListener

        listener = RsgiListener(nothing, max_body_bytes=16 << 20)
    else:
        from tiered.api.kit.aiohttp_server import AiohttpListener

        listener = AiohttpListener(nothing, max_body_bytes=16 << 20)
    await listener.start(host, port)  # type: ignore[attr-defined]
    print(f"null server ({stack}) on http://{host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await listener.stop()  # type: ignore[attr-defined]


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stack", choices=("granian", "aiohttp"), default="granian")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=4438)
    a = p.parse_args()
    import uvloop

    uvloop.install()
    asyncio.run(main(a.stack, a.host, a.port))
