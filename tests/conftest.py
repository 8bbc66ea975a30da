"""Fixtures shared by every test module, and the session-wide record of S3 operations.

The object-store fixtures live here, once, so that one moto server and one Ceph
gateway serve the whole session (a session fixture bound in several modules
would start one per module): ``aws_test_env`` and ``moto_s3``
(``s3_server.py``), ``ceph_rgw`` and ``ceph_rgw_env`` (``ceph_rgw.py``),
``moto_iam`` and ``s3_backend`` (``s3_backends.py``).

``s3_operations`` records, for the whole session, every S3 operation tiered's
code makes, in this process and in the ``tiered`` subprocesses tests start
(``s3_ops.py``). Tests marked ``after_s3_tests`` run last, when the record is
complete: ``test_iam_policy.py`` compares it with ``terraform/iam.tf``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import s3_ops
from .ceph_rgw import ceph_rgw, ceph_rgw_env
from .s3_backends import moto_iam, s3_backend
from .s3_server import aws_test_env, moto_s3
from .server_process import ServerProcess

__all__ = ["aws_test_env", "ceph_rgw", "ceph_rgw_env", "moto_iam", "moto_s3", "s3_backend"]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    """A fresh ``tiered serve`` with its own data dir and a short long-poll timeout."""
    srv = ServerProcess(tmp_path / "data", "--long-poll-timeout-s", "2").start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session", autouse=True)
def s3_operations(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Where this session's S3 operations are recorded (see ``s3_ops.py``)."""
    directory = tmp_path_factory.mktemp("s3-operations")
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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Stable: everything else keeps its order; tests that read the session's record go last.
    items.sort(key=lambda item: item.get_closest_marker("after_s3_tests") is not None)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "network: needs PyPI (skipped with the reason when it cannot be reached, except under CI=true)",
    )
