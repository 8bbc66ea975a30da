"""A real S3-compatible store for tests: Ceph RADOS Gateway on 127.0.0.1.

`.ci/ceph-rgw.sh` brings up a one-node Ceph cluster (monitor, memstore OSD,
radosgw with an HTTP and an HTTPS endpoint, the latter signed by a throwaway
CA) in about two seconds; the `ceph_rgw` fixture starts it once per session
and stops it at the end. Tests isolate by key prefix. Bind the fixtures in a
test module to use them:

    from . import ceph_rgw as rgw
    ceph_rgw = rgw.ceph_rgw
    ceph_rgw_env = rgw.ceph_rgw_env

Without the Ceph binaries (`apt-get install -y --no-install-recommends radosgw
ceph-mon ceph-osd ceph-common`) tests that use the fixture are skipped, except
under CI (`CI=true`), where that is a failure: CI installs them, and a skip
would hide a missing install step.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent.parent / ".ci" / "ceph-rgw.sh"
BINARIES = ("ceph-mon", "ceph-osd", "radosgw")
INSTALL_HINT = "apt-get install -y --no-install-recommends radosgw ceph-mon ceph-osd ceph-common"
START_TIMEOUT_S = 240

# Like tests/support/s3_server.py: an isolated AWS configuration, nothing inherited.
_CLEARED_ENV = (
    "AWS_PROFILE",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_CA_BUNDLE",
)


@dataclass(frozen=True)
class RGWEndpoint:
    """The running gateway: one bucket, one S3 user."""

    url: str  # http://127.0.0.1:PORT
    tls_url: str  # https://127.0.0.1:PORT, certificate signed by the CA in ca_bundle
    ca_bundle: str  # PEM file of the throwaway CA
    bucket: str
    region: str
    access_key: str
    secret_key: str
    state_dir: Path

    def endpoint(self, tls: bool = False) -> str:
        return self.tls_url if tls else self.url

    def aws_env(self, *, tls: bool = False) -> dict[str, str]:
        """The standard AWS environment chain pointed at this gateway's user.

        With ``tls``, also ``AWS_CA_BUNDLE``, which botocore uses to verify
        the HTTPS endpoint when nothing passes a CA bundle explicitly.
        """
        env = {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": self.region,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
        }
        if tls:
            env["AWS_CA_BUNDLE"] = self.ca_bundle
        return env


def serve_env(rgw: RGWEndpoint, *, tls: bool = False) -> dict[str, str]:
    """Environment for a subprocess ``tiered serve`` storing its cold tier in the gateway.

    Credentials travel only through the standard AWS environment chain
    (nothing on the command line), as in production; over HTTPS the CA
    bundle travels as ``AWS_CA_BUNDLE``. Use with `serve_args`.
    """
    return rgw.aws_env(tls=tls)


def serve_args(rgw: RGWEndpoint, prefix: str, *, tls: bool = False) -> list[str]:
    """``tiered serve`` flags for the gateway's bucket under ``prefix``."""
    return [
        "--cold-store", "s3",
        "--s3-bucket", rgw.bucket,
        "--s3-prefix", prefix,
        "--s3-endpoint", rgw.endpoint(tls),
        "--s3-region", rgw.region,
        "--s3-addressing-style", "path",
    ]  # fmt: skip


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: the CI job must install them)", pytrace=False)
    pytest.skip(reason)


def _read_env(path: Path) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep:
            values[name.strip()] = value.strip()
    return values


def _run_script(
    command: str, state: Path, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), command, str(state)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


@pytest.fixture(scope="session")
def ceph_rgw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RGWEndpoint]:
    """Start the gateway once per session (ports picked free) and stop it at the end."""
    missing = [name for name in BINARIES if shutil.which(name) is None]
    if missing:
        _unavailable(f"Ceph RGW is not installed (no {', '.join(missing)}): {INSTALL_HINT}")
    state = tmp_path_factory.mktemp("ceph-rgw")
    env = {**os.environ, "RGW_PORT": "0", "RGW_TLS_PORT": "0", "MON_PORT": "0"}
    try:
        started = _run_script("up", state, START_TIMEOUT_S, env)
    except subprocess.TimeoutExpired as exc:
        _run_script("down", state, 120)
        pytest.fail(
            f"{SCRIPT.name} up did not finish within {START_TIMEOUT_S} s:\n{exc.stdout!r}\n{exc.stderr!r}"
        )
    if started.returncode != 0:
        _run_script("down", state, 120)
        pytest.fail(
            f"{SCRIPT.name} up failed ({started.returncode}):\n{started.stdout}\n{started.stderr}",
            pytrace=False,
        )
    sys.stderr.write(f"\n{SCRIPT.name} up:\n{started.stdout}")
    values = _read_env(state / "env")
    try:
        yield RGWEndpoint(
            url=values["RGW_URL"],
            tls_url=values["RGW_TLS_URL"],
            ca_bundle=values["RGW_CA_BUNDLE"],
            bucket=values["RGW_BUCKET"],
            region=values["RGW_REGION"],
            access_key=values["RGW_ACCESS_KEY"],
            secret_key=values["RGW_SECRET_KEY"],
            state_dir=state,
        )
    finally:
        stopped = _run_script("down", state, 120)
        if stopped.returncode != 0:
            pytest.fail(f"{SCRIPT.name} down failed:\n{stopped.stdout}\n{stopped.stderr}", pytrace=False)


@pytest.fixture
def ceph_rgw_env(ceph_rgw: RGWEndpoint, monkeypatch: pytest.MonkeyPatch) -> RGWEndpoint:
    """Point this process's AWS credential chain at the gateway for one test.

    S3Store takes no keys (only the standard chain), so in-process stores
    find the gateway's user through these variables.
    """
    for name in _CLEARED_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in ceph_rgw.aws_env().items():
        monkeypatch.setenv(name, value)
    return ceph_rgw
