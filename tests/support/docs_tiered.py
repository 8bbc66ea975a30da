"""``tiered`` as the documentation tests run it: the real command, except that it never listens off loopback.

The docs show ``tiered serve --host 0.0.0.0 ...``. The tests run that command
as written: the same argument parser, config loader and start-up checks (the
refusal of an open server off loopback, the exposure warnings) see
``0.0.0.0``. Only the listener is told to bind ``127.0.0.1`` instead of an
address that is not loopback, because a test must not open a port to the
network. It says so on stderr. Run as a script (``tests/`` is then
``sys.path[0]``, dropped so no test module shadows a real one).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def main() -> int:
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        sys.path.pop(0)
    from tiered.cli import serve as serve_module
    from tiered.cli.main import main as tiered_main
    from tiered.core.hosts import all_loopback, listen_addresses

    real_make_listener = serve_module.make_listener

    class LoopbackListener:
        def __init__(self, listener: Any) -> None:
            self.listener = listener

        async def start(self, host: str, port: int) -> list[tuple[str, int]]:
            if not all_loopback(listen_addresses(host)):
                print(f"docs-test: listening on 127.0.0.1 instead of {host}", file=sys.stderr, flush=True)
                host = "127.0.0.1"
            result: list[tuple[str, int]] = await self.listener.start(host, port)
            return result

        async def stop(self, timeout: float = 5.0) -> None:
            await self.listener.stop(timeout)

    def make_listener(config: Any, handler: Any) -> Any:
        return LoopbackListener(real_make_listener(config, handler))

    serve_module.make_listener = make_listener
    return tiered_main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
