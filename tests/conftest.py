from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .server_process import ServerProcess


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A fresh ``tiered serve`` with its own data dir and a short long-poll timeout."""
    srv = ServerProcess(tmp_path / "data", "--long-poll-timeout-s", "2").start()
    try:
        yield srv
    finally:
        srv.stop()
