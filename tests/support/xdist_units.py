"""How the run is cut into pytest-xdist units of work, and the scheduler that deals them.

xdist's own ``--dist loadgroup`` learns each test's ``xdist_group`` by a
suffix it writes into the test's node id on the worker; pytest 9.2 computes
node ids another way, so the suffix is silently lost and every test becomes a
unit of its own (pytest-xdist issue 1386). Here the workers, which collect,
write each test's unit to ``<run dir>/xdist-units.json`` (``write``), and the
controller's scheduler, which only sees node ids, reads it (``Scheduling``: the
``loadscope`` scheduler with these units). Every worker collects the same
tests in the same order (xdist checks), so they write the same file; the
controller deals only after every worker has finished collecting.

Units are dealt in the order of their first test (``--no-loadscope-reorder``),
which ``conftest.py`` sorts: longest first, the ``after_s3_tests`` last.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

FILE = "xdist-units.json"


def write(run_dir: Path, units: dict[str, str]) -> None:
    """Each test's unit (node id -> unit name), atomically: the other workers write the same."""
    path = run_dir / FILE
    scratch = path.with_name(f".{FILE}.{os.getpid()}")
    scratch.write_text(json.dumps(units))
    os.replace(scratch, path)


class Scheduling(LoadScopeScheduling):
    """``loadscope``, with the units the workers wrote instead of one per module or class."""

    def __init__(self, config: pytest.Config, log: Any, run_dir: Path) -> None:
        super().__init__(config, log)
        self.run_dir = run_dir
        self._units: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._units is None:
            try:
                self._units = json.loads((self.run_dir / FILE).read_text())
            except FileNotFoundError:  # no worker could say (they failed to collect): one unit each
                self._units = {}
        assert self._units is not None
        return self._units.get(nodeid, nodeid)
