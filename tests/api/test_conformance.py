"""The official Durable Streams server conformance suite, against ``tiered serve``.

The suite's npm package is pinned in ``tests/conformance/package.json`` and
installed once per run into the run's temp dir (the ``conformance_suite``
fixture, ``tests/support/node_packages.py``). Without node/npm the test skips, except under
CI (``CI=true``), where a skip would hide a missing install step.

Each test of the suite gets ``--testTimeout`` (vitest's own default is 5 s)
stretched by the machine's load (``tests/support/deadlines.py``): a budget for an idle
machine is too short at a load average of 8 on 2 cores. Budgets the suite sets
itself (the long-polls') are unchanged.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.support.deadlines import scaled
from tests.support.s3_backends import WITHOUT_IAM, S3Backend
from tests.support.server_process import ServerProcess

EXPECTED_PASSED = 332  # every non-subscription test of suite 0.3.6
EXPECTED_PASSED_WITH_SUBSCRIPTIONS = 338  # ... plus its 6 subscription tests (CONFORMANCE_SUBSCRIPTIONS=1)
# Ceph over plain HTTP is the same S3 code as over HTTPS, minus TLS (tests/cold/test_ceph_rgw.py covers
# both transports); one suite run each for moto and Ceph keeps the suite's wall time down.
CONFORMANCE_S3 = tuple(name for name in WITHOUT_IAM if name != "ceph-http")


def run_suite(
    home: Path,
    url: str,
    *,
    long_poll_ms: int = 20000,
    env: dict[str, str] | None = None,
    test_timeout_s: float = 5.0,
    vitest_args: tuple[str, ...] = (),
) -> tuple[int, int, str]:
    """Run the suite installed in ``home`` (``env``: extra variables for the runner; ``test_timeout_s``:
    each test's budget on an idle machine, scaled; ``vitest_args``: e.g. a ``-t`` filter);
    returns (passed, failed, output)."""
    timeout_ms = int(scaled(test_timeout_s) * 1000)
    env = {
        **os.environ,
        "CONFORMANCE_TEST_URL": url,
        "LONG_POLL_MS": str(long_poll_ms),
        "NO_COLOR": "1",
        **(env or {}),
    }
    proc = subprocess.run(
        [
            "npx", "vitest", "run", "suite.test.mjs", "--no-coverage", "--reporter=default",
            f"--testTimeout={timeout_ms}", *vitest_args,
        ],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=scaled(900),
    )  # fmt: skip
    out = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
    summary = re.search(r"Tests\s+(.*)\(\d+\)", out)
    text = summary.group(1) if summary else ""
    passed = int(m.group(1)) if (m := re.search(r"(\d+) passed", text)) else 0
    failed = int(m.group(1)) if (m := re.search(r"(\d+) failed", text)) else 0
    return passed, failed, out


def _run_against(suite: Path, server: ServerProcess) -> None:
    server.start()
    try:
        passed, failed, out = run_suite(suite, server.url)
    finally:
        server.stop()
    failures = "\n".join(line for line in out.splitlines() if "FAIL" in line or " × " in line)
    assert failed == 0, f"{failed} conformance tests failed:\n{failures}"
    assert passed == EXPECTED_PASSED, out[-3000:]


@pytest.mark.conformance
def test_conformance_suite_aggressive_flush_to_local_store(conformance_suite: Path, tmp_path: Path) -> None:
    """Data moves to the local-directory object store almost at once; reads stitch both tiers."""
    _run_against(
        conformance_suite,
        ServerProcess(
            tmp_path / "data",
            "--long-poll-timeout-s",
            "3",
            "--flush-interval-s",
            "0.05",
            "--hot-retention-s",
            "0",
            "--segment-bytes",
            "2097152",
            "--max-body-bytes",
            "2000000",
        ),
    )


@pytest.mark.conformance
@pytest.mark.parametrize("s3_backend", CONFORMANCE_S3, indirect=True)
def test_conformance_suite_cold_reads_from_s3(
    conformance_suite: Path, tmp_path: Path, s3_backend: S3Backend
) -> None:
    """Against moto and Ceph RGW (over HTTPS with its own CA), hot copies dropped at once: reads really
    come from S3."""
    _run_against(
        conformance_suite,
        ServerProcess(
            tmp_path / "data",
            "--long-poll-timeout-s",
            "3",
            *s3_backend.serve_args(),
            "--flush-interval-s",
            "0.05",
            "--hot-retention-s",
            "0",
            env=s3_backend.env,
        ),
    )


@pytest.mark.conformance
def test_conformance_suite_with_subscriptions(conformance_suite: Path, tmp_path: Path) -> None:
    """The whole suite including the reserved subscription APIs (webhooks to the suite's 127.0.0.1 receivers),
    against the server as `tiered serve` starts it (no separate run without subscriptions: this one is it, plus 6)."""
    # The suite's webhook receivers listen on 127.0.0.1: loopback webhooks are for development only.
    server = ServerProcess(
        tmp_path / "data", "--long-poll-timeout-s", "3", "--webhook-allow-loopback", "true"
    ).start()
    try:
        passed, failed, out = run_suite(conformance_suite, server.url, env={"CONFORMANCE_SUBSCRIPTIONS": "1"})
    finally:
        server.stop()
    failures = "\n".join(line for line in out.splitlines() if "FAIL" in line or " × " in line)
    assert failed == 0, f"{failed} conformance tests failed:\n{failures}"
    assert passed == EXPECTED_PASSED_WITH_SUBSCRIPTIONS, out[-3000:]
