"""Which S3 operations tiered's own code makes, recorded over the whole test session.

``install()`` wraps ``S3Store.open`` so every client the store opens gets a
botocore ``before-call`` hook (aiobotocore emits the same events) that notes the
operation's name (``PutObject``, ``ListObjectsV2``...; ``DeleteObject(VersionId)``
when it names an object version, which IAM authorizes with another action). Only S3Store's clients
are hooked: the bucket set-up and inspection tests do with their own boto3
clients is not tiered's code and is not recorded.

Names go to one file per process under ``$TIERED_TEST_S3_OPS_DIR`` so that
``tiered serve``/``gc``/``verify`` subprocesses count too: tests start them with
``tiered_command()``, which is this file run as a script, i.e. the ``tiered``
command line with the hook installed first. ``tests/conftest.py`` sets the
directory and installs the hook for the session; ``tests/deploy/test_iam_policy.py`` reads
the union and compares it with the IAM policy in ``terraform/iam.tf``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

ENV = "TIERED_TEST_S3_OPS_DIR"

_seen: set[str] = set()
_installed = False


def _note(operation: str) -> None:
    if operation in _seen:
        return
    _seen.add(operation)
    directory = os.environ.get(ENV)
    if directory:
        with open(Path(directory) / f"{os.getpid()}.ops", "a") as f:
            f.write(operation + "\n")


def _before_call(model: Any, params: Any = None, **_: Any) -> None:
    _note(model.name + ("(VersionId)" if _names_a_version(params) else ""))


def _names_a_version(request: Any) -> bool:
    """A request on one object version needs other IAM actions (s3:GetObjectVersion...).

    ``before-call`` carries the serialized request: the version is a query
    parameter, or (DeleteObjects) an element of the XML body.
    """
    if not isinstance(request, dict):
        return False
    query = request.get("query_string") or {}
    if isinstance(query, dict) and "versionId" in query:
        return True
    body = request.get("body")
    return isinstance(body, bytes) and b"<VersionId>" in body


def install() -> None:
    """Hook every client S3Store opens from now on, in this process (idempotent)."""
    global _installed
    if _installed:
        return
    from tiered.cold.objects.s3 import S3Store

    original = S3Store.open

    async def open_recorded(self: S3Store) -> S3Store:
        fresh = self._s3 is None
        store = await original(self)
        if fresh:
            store._s3.meta.events.register("before-call.s3", _before_call)
        return store

    S3Store.open = open_recorded  # type: ignore[method-assign]
    _installed = True


def recorded(directory: Path) -> set[str]:
    """Every operation recorded under ``directory`` by any process."""
    names: set[str] = set()
    for path in directory.glob("*.ops"):
        names.update(line.strip() for line in path.read_text().splitlines() if line.strip())
    return names


def tiered_command() -> list[str]:
    """The argv prefix that runs ``tiered`` (with the hook, when the session records)."""
    if os.environ.get(ENV):
        return [sys.executable, str(Path(__file__).resolve())]
    return [sys.executable, "-m", "tiered.cli"]


if __name__ == "__main__":
    # Run as a script, tests/ is sys.path[0]: drop it so no test module shadows a real one.
    if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
        sys.path.pop(0)
    install()
    from tiered.cli.main import main

    sys.exit(main())
