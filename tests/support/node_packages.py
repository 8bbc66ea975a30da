"""The npm packages some tests run (the official conformance suite, the TypeScript client), once per run.

Each set is pinned by a ``package.json`` in the repository (``tests/conformance``,
``tests/clients``) and installed with npm into the run's temp dir
(``run_dirs.py``), shared by the xdist workers: the first worker that needs it
installs it under a lock, the others wait for it and use it. Outside the temp
dir only npm's own download cache is written (``~/.npm``, as by any npm install;
``npm_config_cache`` moves it), which keeps the per-run install to seconds.
``TIERED_CONFORMANCE_HOME`` / ``TIERED_CLIENTS_HOME`` name a lasting directory
instead, to skip the install on later runs (redone when the pinned files change).

Without node and npm a test that needs them skips, except under CI
(``CI=true``), where that would hide a missing install step: it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import run_dirs

INSTALL_TIMEOUT_S = 600


def require_node(what: str) -> None:
    if shutil.which("node") and shutil.which("npm"):
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"node and npm are required under CI to run {what}", pytrace=False)
    pytest.skip(f"node/npm not installed: {what} cannot run")


def install(
    factory: pytest.TempPathFactory, sources: Path, files: tuple[str, ...], installed: str, env_var: str
) -> Path:
    """``sources``' ``files`` (``package.json`` first) copied to the install dir and ``npm install``
    run there unless ``installed`` (a path under ``node_modules``) is there for the same pins."""
    configured = os.environ.get(env_var)
    if configured:
        home = Path(configured)
        home.mkdir(parents=True, exist_ok=True)
    else:
        home = run_dirs.shared(factory, "npm") / sources.name
    with run_dirs.locked(home.parent / f".{home.name}.lock"):
        home.mkdir(exist_ok=True)
        for name in files:
            src, dst = sources / name, home / name
            if not dst.exists() or dst.read_bytes() != src.read_bytes():
                shutil.copyfile(src, dst)
                if name == "package.json":
                    shutil.rmtree(home / "node_modules", ignore_errors=True)
        if not (home / "node_modules" / installed).exists():
            subprocess.run(
                ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error"],
                cwd=home,
                check=True,
                timeout=INSTALL_TIMEOUT_S,
            )
    return home
