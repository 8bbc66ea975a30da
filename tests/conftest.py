"""Fixtures shared by every test module, the session-wide record of S3 operations, and the run's layout.

The object-store fixtures live here, once, so that one moto server and one Ceph
gateway serve the whole session (a session fixture bound in several modules
would start one per module): ``aws_test_env`` and ``moto_s3``
(``tests/support/s3_server.py``), ``ceph_rgw`` and ``ceph_rgw_env`` (``tests/support/ceph_rgw.py``),
``moto_iam`` and ``s3_backend`` (``tests/support/s3_backends.py``); and the npm install of
the official conformance suite, ``conformance_suite`` (``tests/support/node_packages.py``).

``s3_operations`` records, for the whole run, every S3 operation tiered's
code makes, in this process and in the ``tiered`` subprocesses tests start
(``tests/support/s3_ops.py``), in a directory every xdist worker shares (``tests/support/run_dirs.py``).
Tests marked ``after_s3_tests`` run last, when the record is complete
(``s3_operations_complete``): ``tests/deploy/test_iam_policy.py`` compares it with
``terraform/iam.tf``.

The run is spread over pytest-xdist workers (``-n auto --dist loadscope`` in
pyproject's addopts; ``-n 0`` runs it in one process), in units of work
(``_unit``, dealt by ``xdist_units.Scheduling``): a whole test module when its
tests share a module- or class-scoped fixture (a server started once for
them), else each test alone; every test that uses Ceph RGW, so that one
gateway serves them all; and the ``after_s3_tests``, dealt last and on their
own. The longest are dealt first (``LONGEST_FIRST``), so that no worker is
left with one at the end. Under xdist each worker has its own session
fixtures (its own moto server), which is safe: tests isolate by key prefix.

Every wait has a deadline for an idle machine, stretched by the measured load
(``tests/support/deadlines.py``); so is pytest-timeout's limit on each test. Hypothesis runs
without its per-example deadline (the ``tiered`` profile).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.support import node_packages, run_dirs, s3_ops
from tests.support.ceph_rgw import ceph_rgw, ceph_rgw_env
from tests.support.deadlines import scaled, wait_for
from tests.support.s3_backends import moto_iam, s3_backend
from tests.support.s3_server import aws_test_env, moto_s3
from tests.support.server_process import ServerProcess

__all__ = ["aws_test_env", "ceph_rgw", "ceph_rgw_env", "moto_iam", "moto_s3", "s3_backend"]

# Property tests assert properties, not speed (speed goals live in bench/): no per-example deadline
# and no "too slow" health check, both of which a loaded machine trips. A test's own settings still
# win; under CI hypothesis's own CI profile is the parent.
settings.register_profile(
    "tiered", parent=settings.default, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("tiered")

CONFORMANCE = Path(__file__).resolve().parent / "conformance"
TIMEOUT_CAP_S = 1800.0

# How long the after_s3_tests wait for the other workers to finish theirs, on an idle machine (scaled):
# a worker may have just started the longest group of the run when the last group is dealt.
OTHER_WORKERS_S = 900.0

# Dealt first, longest first (a serial run's time per module, CI's Ceph group at the head), so that
# no worker is left running a long one alone at the end; the rest follow in collection order. Only
# the order depends on this list, never a result.
LONGEST_FIRST = (
    "ceph-rgw",
    "test_conformance",  # four runs of the official suite, each its own unit
    "test_cluster_conformance",
    "test_cluster_property",
    "test_cluster_chaos",
    "test_cluster_tokens",
    "test_cluster_serve",
    "test_cluster_fork",
    "test_cold_tier",
    "test_crash_recovery",
)
CEPH_UNIT = "ceph-rgw"
AFTER_UNIT = "after-s3-tests"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A fresh ``tiered serve`` with its own data dir and a short long-poll timeout."""
    srv = ServerProcess(tmp_path / "data", "--long-poll-timeout-s", "2").start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def conformance_suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The official conformance suite, installed once per run (``tests/support/node_packages.py``)."""
    node_packages.require_node("the official conformance suite")
    return node_packages.install(
        tmp_path_factory,
        CONFORMANCE,
        ("package.json", "suite.test.mjs"),
        "@durable-streams/server-conformance-tests",
        "TIERED_CONFORMANCE_HOME",
    )


@pytest.fixture(scope="session", autouse=True)
def s3_operations(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where this run's S3 operations are recorded (see ``tests/support/s3_ops.py``), shared by every worker."""
    directory = run_dirs.shared(tmp_path_factory, "s3-operations")
    saved = os.environ.get(s3_ops.ENV)
    os.environ[s3_ops.ENV] = str(directory)
    s3_ops.install()
    try:
        yield directory
    finally:
        if saved is None:
            os.environ.pop(s3_ops.ENV, None)
        else:
            os.environ[s3_ops.ENV] = saved


@pytest.fixture
def s3_operations_complete(s3_operations: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The record, once every other xdist worker has run all its tests (``pytest_sessionfinish``).

    This worker's own tests before this one are done: the after_s3_tests come last in its queue.
    """
    me = run_dirs.worker()
    if me is None:
        return s3_operations
    others = {f"gw{i}" for i in range(run_dirs.worker_count())} - {me}
    finished = run_dirs.shared(tmp_path_factory, "finished")

    def waiting() -> set[str]:
        return others - {path.name for path in finished.iterdir()}

    wait_for(
        lambda: not waiting(),
        OTHER_WORKERS_S,
        "the other workers to finish their tests",
        interval=0.5,
        explain=lambda: f"still running: {sorted(waiting())}",
    )
    return s3_operations


def _unit(item: pytest.Item) -> str:
    """The item's unit of work under xdist (see the module docstring)."""
    if item.get_closest_marker("after_s3_tests") is not None:
        return AFTER_UNIT
    if "ceph" in item.nodeid or {"ceph_rgw", "ceph_rgw_env"} & set(getattr(item, "fixturenames", ())):
        return CEPH_UNIT
    info = getattr(item, "_fixtureinfo", None)
    scopes = {d.scope for defs in info.name2fixturedefs.values() for d in defs} if info else {"module"}
    return str(item.path) if scopes & {"module", "class", "package"} else item.nodeid


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Stable: everything else keeps its order; tests that read the session's record go last.
    items.sort(key=lambda item: item.get_closest_marker("after_s3_tests") is not None)
    if run_dirs.worker() is None:  # not distributed (or the controller, which collects nothing)
        return
    units = {item: _unit(item) for item in items}
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def order(item: pytest.Item) -> tuple[bool, int]:
        unit = units[item]
        return unit == AFTER_UNIT, rank.get(unit if unit == CEPH_UNIT else item.path.stem, len(rank))

    items.sort(key=order)  # units are dealt in the order of their first test (--no-loadscope-reorder)
    from tests.support.xdist_units import write

    write(run_dirs.of_config(config), {item.nodeid: units[item] for item in items})


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """On the controller: deal the units the workers wrote (``tests/support/xdist_units.py``), for ``--dist loadscope``."""
    if config.getvalue("dist") != "loadscope":
        return None
    from tests.support.xdist_units import Scheduling

    return Scheduling(config, log, run_dirs.of_config(config))


@pytest.hookimpl(trylast=True)  # after the session's fixtures were torn down
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under xdist: this worker ran all its tests; ``s3_operations_complete`` waits for that."""
    name = run_dirs.worker()
    if name is not None:
        finished = run_dirs.of_config(session.config) / "finished"
        finished.mkdir(exist_ok=True)
        (finished / name).touch()


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> Any:
    """pytest-timeout's limit on a test, stretched by the load when the test starts, like its waits,
    to at most ``TIMEOUT_CAP_S`` (a hung test must still end well within CI's time)."""
    import pytest_timeout

    limit = min(scaled(settings.timeout), max(settings.timeout, TIMEOUT_CAP_S))
    return pytest_timeout.pytest_timeout_set_timer(item, settings._replace(timeout=limit))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "network: needs PyPI (skipped with the reason when it cannot be reached, except under CI=true)",
    )
