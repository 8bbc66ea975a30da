"""The official Durable Streams server conformance suite, against ``tiered serve``.

The suite's npm package is pinned in ``tests/conformance/package.json`` and
installed on first use into ``$TIERED_CONFORMANCE_HOME`` (default
``~/.cache/tiered-conformance``). Without node/npm the test skips, except
under CI (``CI=true``), where a skip would hide a missing install step.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .s3_backends import WITHOUT_IAM, S3Backend
from .server_process import ServerProcess

HERE = Path(__file__).parent / "conformance"
EXPECTED_PASSED = 332  # every non-subscription test of suite 0.3.6
EXPECTED_PASSED_WITH_SUBSCRIPTIONS = 338  # ... plus its 6 subscription tests (CONFORMANCE_SUBSCRIPTIONS=1)


def _suite_home() -> Path:
    home = Path(os.environ.get("TIERED_CONFORMANCE_HOME", Path.home() / ".cache" / "tiered-conformance"))
    home.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "suite.test.mjs"):
        src, dst = HERE / name, home / name
        if not dst.exists() or dst.read_bytes() != src.read_bytes():
            shutil.copyfile(src, dst)
            shutil.rmtree(home / "node_modules", ignore_errors=True)
    if not (home / "node_modules" / "@durable-streams" / "server-conformance-tests").exists():
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=home,
            check=True,
            timeout=600,
        )
    return home


def run_suite(
    url: str,
    *,
    long_poll_ms: int = 20000,
    env: dict[str, str] | None = None,
    vitest_args: tuple[str, ...] = (),
) -> tuple[int, int, str]:
    """Run the suite (``env``: extra variables for the runner, ``vitest_args``: e.g. a ``-t`` filter);
    returns (passed, failed, output)."""
    home = _suite_home()
    env = {
        **os.environ,
        "CONFORMANCE_TEST_URL": url,
        "LONG_POLL_MS": str(long_poll_ms),
        "NO_COLOR": "1",
        **(env or {}),
    }
    proc = subprocess.run(
        ["npx", "vitest", "run", "suite.test.mjs", "--no-coverage", "--reporter=default", *vitest_args],
        cwd=home,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
    summary = re.search(r"Tests\s+(.*)\(\d+\)", out)
    text = summary.group(1) if summary else ""
    passed = int(m.group(1)) if (m := re.search(r"(\d+) passed", text)) else 0
    failed = int(m.group(1)) if (m := re.search(r"(\d+) failed", text)) else 0
    return passed, failed, out


def _require_node() -> None:
    if shutil.which("node") and shutil.which("npm"):
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail("node and npm are required under CI to run the conformance suite")
    pytest.skip("node/npm not installed: the official conformance suite cannot run")


def _run_against(server: ServerProcess) -> None:
    server.start()
    try:
        passed, failed, out = run_suite(server.url)
    finally:
        server.stop()
    failures = "\n".join(line for line in out.splitlines() if "FAIL" in line or " × " in line)
    assert failed == 0, f"{failed} conformance tests failed:\n{failures}"
    assert passed == EXPECTED_PASSED, out[-3000:]


@pytest.mark.conformance
def test_conformance_suite_hot_only(tmp_path: Path) -> None:
    _require_node()
    _run_against(ServerProcess(tmp_path / "data", "--long-poll-timeout-s", "3"))


@pytest.mark.conformance
def test_conformance_suite_aggressive_flush_to_local_store(tmp_path: Path) -> None:
    """Data moves to the local-directory object store almost at once; reads stitch both tiers."""
    _require_node()
    _run_against(
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
        )
    )


@pytest.mark.conformance
@pytest.mark.parametrize("s3_backend", WITHOUT_IAM, indirect=True)
def test_conformance_suite_cold_reads_from_s3(tmp_path: Path, s3_backend: S3Backend) -> None:
    """Against moto and Ceph RGW (HTTP, and HTTPS with its own CA), hot copies dropped at once:
    reads really come from S3."""
    _require_node()
    _run_against(
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
        )
    )


@pytest.mark.conformance
def test_conformance_suite_with_subscriptions(tmp_path: Path) -> None:
    """The whole suite including the reserved subscription APIs (webhooks to the suite's 127.0.0.1 receivers)."""
    _require_node()
    # The suite's webhook receivers listen on 127.0.0.1: loopback webhooks are for development only.
    server = ServerProcess(
        tmp_path / "data", "--long-poll-timeout-s", "3", "--webhook-allow-loopback", "true"
    ).start()
    try:
        passed, failed, out = run_suite(server.url, env={"CONFORMANCE_SUBSCRIPTIONS": "1"})
    finally:
        server.stop()
    failures = "\n".join(line for line in out.splitlines() if "FAIL" in line or " × " in line)
    assert failed == 0, f"{failed} conformance tests failed:\n{failures}"
    assert passed == EXPECTED_PASSED_WITH_SUBSCRIPTIONS, out[-3000:]
