"""Directories one test run shares between its pytest-xdist workers, and a lock to share them with.

Each xdist worker gets a base temp dir of its own (``<run>/popen-gw0``...), and
the run's is their parent; without xdist the run's is pytest's base temp dir
itself. What the whole run shares lives there, so that nothing a test writes
outlives pytest's own clean-up of old base temp dirs (it keeps the last three):

* ``s3-operations/``: every process's record of the S3 operations tiered made
  (``s3_ops.py``), read by the last test of the run (``tests/deploy/test_iam_policy.py``);
* ``finished/``: one file per worker whose tests are all done (``conftest.py``);
* ``xdist-units.json``: how the run is cut into units of work (``xdist_units.py``);
* ``npm/``: the conformance suite's and the TypeScript client's npm installs,
  made once per run by the first worker that needs them (``node_packages.py``).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def worker() -> str | None:
    """This process's xdist worker id (``gw0``...), or None when the run is not distributed."""
    return os.environ.get("PYTEST_XDIST_WORKER")


def worker_count() -> int:
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def run_dir(factory: pytest.TempPathFactory) -> Path:
    """The run's base temp dir, the same for every worker."""
    base = factory.getbasetemp()
    return base.parent if worker() else base


def of_config(config: pytest.Config) -> Path:
    """``run_dir`` where no fixture is at hand (hooks): pytest's own factory for the run."""
    factory: pytest.TempPathFactory = config._tmp_path_factory  # type: ignore[attr-defined]
    return run_dir(factory)


def shared(factory: pytest.TempPathFactory, name: str) -> Path:
    """``<run dir>/<name>``, created if missing (by whichever worker comes first)."""
    path = run_dir(factory) / name
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing): one worker at a time, others wait."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
