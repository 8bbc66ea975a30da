"""Reading the dependency locks in requirements/ (written by .ci/lock) and pyproject.toml's requirements.

Shared by ``tests/deploy/test_lock.py`` (the locks agree with pyproject) and the artifact tests
(the wheelhouse installs exactly the runtime lock).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent.parent
LOCKS = ROOT / "requirements"
LOCK_SCRIPT = ROOT / ".ci" / "lock"

# One pinned requirement: `name==version [; marker] \` then `--hash=sha256:...` lines.
_PIN = re.compile(
    r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+?)(?:\s*;\s*(?P<marker>[^\\]+?))?\s*\\?$"
)
_HASH = re.compile(r"^\s+--hash=sha256:(?P<digest>[0-9a-f]{64})\s*\\?$")


@dataclass(frozen=True)
class Pin:
    name: str  # canonical (PEP 503)
    version: str
    marker: str | None
    hashes: frozenset[str]


# What the artifact targets: CPython 3.11 on Linux (Amazon Linux 2023's python3.11, the image's base).
TARGET = {
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "os_name": "posix",
    "platform_python_implementation": "CPython",
    "implementation_name": "cpython",
    "extra": "",
}


def read_lock(path: Path, environment: dict[str, str] = TARGET) -> dict[str, Pin]:
    """The pins of one lock file that apply in ``environment``, by canonical name.

    A universal lock may pin a name twice under exclusive markers (one version for
    Python 3.11, another for 3.12+); two pins of one name that both apply fail.
    """
    pins: dict[str, Pin] = {}
    current: tuple[str, str, str | None] | None = None
    hashes: set[str] = set()

    def close() -> None:
        if current is not None:
            name, version, marker = current
            if marker is not None and not Marker(marker).evaluate(environment):
                return
            assert name not in pins, f"{path.name}: {name} pinned twice for one environment"
            pins[name] = Pin(name, version, marker, frozenset(hashes))

    for line in path.read_text().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        pin = _PIN.match(line)
        if pin:
            close()
            current = (canonicalize_name(pin["name"]), pin["version"], pin["marker"])
            hashes = set()
            continue
        digest = _HASH.match(line)
        assert digest and current is not None, f"{path.name}: unexpected line {line!r}"
        hashes.add(digest["digest"])
    close()
    return pins


def pyproject() -> dict[str, object]:
    with (ROOT / "pyproject.toml").open("rb") as f:
        return tomllib.load(f)


def requirements(group: str) -> list[Requirement]:
    """pyproject's requirements: ``runtime``, an extra's name, or ``build`` ([build-system])."""
    project = pyproject()
    if group == "build":
        return [Requirement(r) for r in project["build-system"]["requires"]]  # type: ignore[index]
    if group == "runtime":
        return [Requirement(r) for r in project["project"]["dependencies"]]  # type: ignore[index]
    return [Requirement(r) for r in project["project"]["optional-dependencies"][group]]  # type: ignore[index]


def applies_on_linux(marker: Marker | None) -> bool:
    return marker is None or marker.evaluate(TARGET)
