"""The Dockerfile, read statically (.ci/image builds and runs it where a container engine exists).

The image must be what docs and the Helm chart rely on: multi-stage, the wheel built
with the locked build tools and installed with the locked runtime dependencies
(--require-hashes), a fixed non-root user, the data dir as the only volume, a health
check on /readyz; .dockerignore lets in exactly what the build copies.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text()
    text = re.sub(r"\\\n\s*", " ", text)  # line continuations
    found = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for keyword, rest in instructions():
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, rest))
    return result


def test_the_build_stage_uses_the_locks_and_the_final_stage_copies_only_the_venv() -> None:
    build, final = stages()
    runs = " ".join(rest for keyword, rest in build if keyword == "RUN")
    assert "pip install --require-hashes -r requirements/build.txt" in runs
    assert "python -m build --wheel --no-isolation" in runs
    assert "pip install --require-hashes -r requirements/runtime.txt" in runs
    assert "pip install --no-deps /dist/tiered-" in runs
    assert build[0][1].endswith("AS build")
    copies = [rest for keyword, rest in final if keyword == "COPY"]
    assert copies == ["--from=build /opt/tiered /opt/tiered"]


def test_the_image_runs_as_a_fixed_non_root_user_with_the_data_dir_as_its_volume() -> None:
    final = stages()[-1]
    (user,) = [rest for keyword, rest in final if keyword == "USER"]
    uid, _, gid = user.partition(":")
    assert int(uid) >= 1000 and int(gid) >= 1000
    assert any("useradd --system --uid 10001" in rest for keyword, rest in final if keyword == "RUN")
    (volume,) = [rest for keyword, rest in final if keyword == "VOLUME"]
    assert volume == '["/var/lib/tiered"]'
    env = " ".join(rest for keyword, rest in final if keyword == "ENV")
    assert "TIERED_DATA_DIR=/var/lib/tiered" in env
    assert "TIERED_AUTH" not in env  # off loopback tiered refuses to start until the operator chooses
    assert ("ENTRYPOINT", '["tiered"]') in final and ("CMD", '["serve"]') in final


def test_the_health_check_is_readiness() -> None:
    (check,) = [rest for keyword, rest in instructions() if keyword == "HEALTHCHECK"]
    assert "/readyz" in check and "CMD" in check


def test_dockerignore_lets_in_exactly_what_the_build_copies() -> None:
    allowed = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    copied = set()
    for keyword, rest in stages()[0]:
        if keyword == "COPY" and not rest.startswith("--from"):
            copied |= {part.rstrip("/") for part in rest.split()[:-1]}
    assert copied == allowed
    assert "*" in (ROOT / ".dockerignore").read_text().splitlines()
