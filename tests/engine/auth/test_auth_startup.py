"""Secure by default: no auth configured means loopback only; elsewhere the server refuses to start.

The refusal names the flag to choose and happens before anything is opened
(the data dir is not even created). The address used, 192.0.2.1, is a
documentation address no machine has, so even a regression could not expose
a server: it would fail to bind instead, and the test would still fail.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tiered.core.config import Config, ConfigError, load_config

pytestmark = pytest.mark.timeout(60)


def test_refuses_to_start_on_a_non_loopback_address_without_auth(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tiered.cli",
            "serve",
            "--host",
            "192.0.2.1",
            "--port",
            "4999",
            "--data-dir",
            str(data),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 2, proc.stderr
    assert "--auth tokens|jwt|none" in proc.stderr and "192.0.2.1" in proc.stderr
    assert not data.exists()


@pytest.mark.parametrize(
    ("host", "auth", "refused"),
    [
        ("127.0.0.1", "", False),
        ("127.8.9.1", "", False),
        ("localhost", "", False),
        ("::1", "", False),
        ("0.0.0.0", "", True),
        ("::", "", True),
        ("10.1.2.3", "", True),
        ("tiered.internal", "", True),
        ("127.attacker.example", "", True),  # a name is judged on what it resolves to, not its spelling
        ("0.0.0.0", "none", False),
        ("0.0.0.0", "tokens", False),
    ],
)
def test_exposure_rule(host: str, auth: str, refused: bool) -> None:
    problem = Config(host=host, auth=auth).exposure_problem()
    assert (problem is not None) is refused
    if refused:
        assert problem is not None and "--auth tokens|jwt|none" in problem


def test_auth_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="auth must be"):
        load_config(env={}, overrides={"auth": "basic"})
    with pytest.raises(ConfigError, match="jwks_file"):
        load_config(env={}, overrides={"auth": "jwt"})
    with pytest.raises(ConfigError, match="not a readable file"):
        load_config(
            env={},
            overrides={
                "auth": "jwt",
                "jwks_file": str(tmp_path / "missing.json"),
                "jwt_issuer": "i",
                "jwt_audience": "a",
            },
        )
    with pytest.raises(ConfigError, match="must not be negative"):
        load_config(env={}, overrides={"quota_max_streams": "-1"})
    assert load_config(env={"TIERED_AUTH": "tokens"}).auth_mode == "tokens"
    assert load_config(env={}).auth_mode == "none"
