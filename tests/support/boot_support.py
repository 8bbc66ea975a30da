"""Boot a node's rendered user data in a throwaway directory, against a local S3 (moto's standalone server).

What runs for real: the files cloud-init would write (the module's templates rendered
with the values Terraform would give them, under a temporary root), ``user-data.sh``
itself (bash), ``aws s3 cp`` / ``aws ssm get-parameter`` (the AWS CLI, v1 from PyPI in
a venv of its own, as a stand-in for Amazon Linux's v2: same commands and flags) against
moto, ``python3.11 -m venv``, the offline ``pip install --require-hashes`` from the
wheelhouse, tiered's config check, ``secrets.sh``, and ``tiered serve`` from the
installed venv with the unit's ``ExecStart``.

Stubbed, because it cannot run here (each stub logs its arguments to ``stubs.log``):

* ``dnf`` (this is not Amazon Linux; Python 3.11 is the machine's own);
* ``groupadd`` / ``useradd`` (they would change this shared machine's users);
* ``systemctl`` (no systemd inside a test): the test then does what the units do -
  ``secrets.sh`` is run, ``LoadCredential=`` is a copy of the token file, the data dir
  is created (attaching an EBS volume or asking the instance metadata service cannot
  happen here), and ``tiered.service``'s ``ExecStart`` is run with its arguments;
* the CloudWatch agent's control script.

The AWS endpoint reaches the CLI and tiered through the environment
(``AWS_ENDPOINT_URL``, ``TIERED_S3_ENDPOINT``), never through the rendered files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.support.terraform_hcl import TERRAFORM

TEMPLATES = TERRAFORM / "templates"
ROOT = TERRAFORM.parent
AWSCLI = "awscli==1.46.2"  # the AWS CLI v1 from PyPI: `aws s3 cp` and `aws ssm get-parameter` as on v2
STUBS = ("dnf", "groupadd", "useradd", "systemctl", "amazon-cloudwatch-agent-ctl")


def render(template: Path, values: dict[str, Any]) -> str:
    """Terraform's templatefile for templates that only use plain ${name} interpolation."""
    text = template.read_text()
    assert "%{" not in text, f"{template.name} uses template directives"
    names = set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)\}", text))
    missing = names - set(values)
    assert not missing, f"no value for {sorted(missing)} in {template.name}"

    def value(m: re.Match[str]) -> str:
        v = values[m.group(1)]
        return ("true" if v else "false") if isinstance(v, bool) else str(v)

    return re.sub(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)\}", value, text).replace("$${", "${")


def ci() -> bool:
    return os.environ.get("CI") == "true"


def skip_or_fail(reason: str) -> None:
    if ci():
        pytest.fail(reason)
    pytest.skip(reason)


# ---------------------------------------------------------------- what the tests need from outside


#: Where the packages of tiered's wheel come from in the work tree (pyproject.toml's package-dir).
WHEEL_SOURCES = {
    "tiered/": "tiered/",
    "tiered/hot/": "hot/",
    "tiered/cold/": "cold/",
    "tiered/gc/": "gc/",
    "tiered_client/": "clients/python/tiered_client/",
}


def wheelhouse_problem(house: Path) -> str | None:
    """Why ``house`` is not a wheelhouse of this work tree, or None.

    It must hold exactly what its SHA256SUMS lists, with those digests (what the boot
    script checks), and its tiered wheel must hold the work tree's sources: one built
    before the last change (a stale ``dist/``) would boot other code than the tests test.
    """
    sums = house / "SHA256SUMS"
    if not sums.is_file():
        return "no SHA256SUMS"
    listed = {
        name: digest for digest, name in (line.split(None, 1) for line in sums.read_text().splitlines())
    }
    present = {f.name for f in house.iterdir()} - {"SHA256SUMS", "wheelhouse.json"}
    if set(listed) != present:
        return f"it holds {sorted(present ^ set(listed))} that SHA256SUMS does not list, or the reverse"
    if any(sha256(house / name) != digest for name, digest in listed.items()):
        return "a file does not match its digest in SHA256SUMS"
    wheels = sorted(house.glob("tiered-*.whl"))
    if len(wheels) != 1:
        return f"{len(wheels)} tiered wheels"
    with zipfile.ZipFile(wheels[0]) as wheel:
        packaged = {n: wheel.read(n) for n in wheel.namelist() if ".dist-info/" not in n}
    tree = {
        into + f.relative_to(ROOT / source).as_posix(): f
        for into, source in WHEEL_SOURCES.items()
        for f in (ROOT / source).rglob("*.py")
    }
    if set(packaged) != set(tree):
        return f"its wheel's files differ from the work tree's: {sorted(set(packaged) ^ set(tree))[:5]}"
    changed = [n for n, data in packaged.items() if tree[n].read_bytes() != data]
    if changed:
        return f"its wheel was built from other sources than the work tree's ({changed[:5]} differ)"
    return None


def wheelhouse(tmp_factory: pytest.TempPathFactory) -> Path:
    """The wheelhouse .ci/run built (TIERED_WHEELHOUSE) if it is this work tree's, else one built now with
    deploy/build-artifact.sh (once per session). Under CI a TIERED_WHEELHOUSE that is not fails the test."""
    given = os.environ.get("TIERED_WHEELHOUSE")
    if given:
        problem = wheelhouse_problem(Path(given))
        if problem is None:
            return Path(given)
        if ci():
            pytest.fail(
                f"TIERED_WHEELHOUSE={given} is not this work tree's wheelhouse: {problem} (.ci/artifact)"
            )
    out = tmp_factory.getbasetemp() / "artifact"  # built once per session, shared by the boot tests
    built = [house for house in out.glob("wheelhouse-*") if (house / "wheelhouse.json").is_file()]  # complete
    if built:
        return built[0]
    shutil.rmtree(out, ignore_errors=True)  # what an interrupted build left
    out.mkdir()
    run = subprocess.run(
        [str(ROOT / "deploy" / "build-artifact.sh"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if run.returncode != 0:
        skip_or_fail(f"deploy/build-artifact.sh failed (it needs PyPI): {run.stderr[-2000:]}")
    (house,) = out.glob("wheelhouse-*")
    problem = wheelhouse_problem(house)
    assert problem is None, f"deploy/build-artifact.sh built {house}: {problem}"
    return house


def awscli(tmp_factory: pytest.TempPathFactory) -> Path:
    """A venv holding the AWS CLI (v1, from PyPI), made once per session; returns its bin directory."""
    venv = tmp_factory.getbasetemp() / "awscli"
    if (venv / "bin" / "aws").exists():
        return venv / "bin"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    run = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", AWSCLI],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if run.returncode != 0:
        skip_or_fail(f"cannot install {AWSCLI} (it needs PyPI): {run.stderr[-2000:]}")
    return venv / "bin"


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def upload_wheelhouse(client: Any, bucket: str, house: Path, prefix: str) -> None:
    """What aws_s3_object.wheelhouse does: SHA256SUMS and every file it names, under the prefix."""
    names = ["SHA256SUMS"] + [
        line.split(None, 1)[1] for line in (house / "SHA256SUMS").read_text().splitlines()
    ]
    for name in names:
        client.upload_file(str(house / name), bucket, f"{prefix}/{name}")


def artifact_key_prefix(house: Path, artifact_prefix: str = "artifacts") -> str:
    """local.artifact_key_prefix of terraform/artifact.tf."""
    manifest = json.loads((house / "wheelhouse.json").read_text())
    digest = sha256(house / "SHA256SUMS")
    return f"{artifact_prefix}/tiered-{manifest['tiered_version']}-{manifest['architecture']}-{digest[:16]}"


# ---------------------------------------------------------------- the instance


@dataclass
class Instance:
    """A temporary directory standing in for an instance's file system."""

    root: Path
    aws_bin: Path
    endpoint: str
    region: str
    env: dict[str, str] = field(default_factory=dict)

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def write(self, absolute: str, content: str, mode: int = 0o644) -> Path:
        target = self.path(absolute)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        target.chmod(mode)
        return target

    def stubs(self) -> Path:
        directory = self.root / "stub-bin"
        directory.mkdir(exist_ok=True)
        log = self.root / "stubs.log"
        for name in STUBS:
            script = directory / name
            script.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >>"{log}"\n')
            script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        return directory

    def stub_calls(self) -> list[str]:
        log = self.root / "stubs.log"
        return log.read_text().splitlines() if log.exists() else []

    def environment(self) -> dict[str, str]:
        """A clean environment like cloud-init's, plus the local AWS endpoint and test credentials."""
        keep = {k: v for k, v in os.environ.items() if k in ("HOME", "LANG", "TMPDIR", "SSL_CERT_FILE")}
        return {
            **keep,
            "PATH": f"{self.stubs()}:{self.aws_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_CONFIG_FILE": os.devnull,
            "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
            "AWS_EC2_METADATA_DISABLED": "true",
            # An instance has no pip configuration: no index, find-links or constraints of this machine.
            "PIP_CONFIG_FILE": os.devnull,
            **self.env,
        }

    def run(self, script: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(self.path(script)), *args],
            cwd=self.root,  # cloud-init runs it from /, never from a source tree
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def ssm_client(endpoint: str, region: str) -> Any:
    return boto3.client(
        "ssm",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def exec_start(unit: str) -> list[str]:
    (line,) = re.findall(r"^ExecStart=(.*)$", unit, re.M)
    return line.split()


def copy_credential(instance: Instance, source: str, unit: str, name: str) -> str:
    """systemd's LoadCredential=name:source for a unit: a copy in its credentials directory."""
    target = instance.path(f"/run/credentials/{unit}/{name}")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(instance.path(source), target)
    return str(target)
