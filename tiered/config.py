"""Service configuration: defaults, a TOML file, ``TIERED_*`` env vars, flags.

Precedence, lowest first: built-in defaults, the TOML file (``--config``),
environment variables, command-line flags. Every setting has one name used in
all four places: ``long_poll_timeout_s`` is ``long_poll_timeout_s = 4`` in
TOML, ``TIERED_LONG_POLL_TIMEOUT_S=4`` in the environment and
``--long-poll-timeout-s 4`` on the command line.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

MiB = 1024 * 1024


@dataclass
class Config:
    host: str = "127.0.0.1"
    port: int = 4437
    data_dir: str = "./tiered-data"
    fsync: str = "always"
    fsync_interval_ms: int = 50
    segment_bytes: int = 64 * MiB
    max_body_bytes: int = 16 * MiB
    max_hot_bytes: int = 8 * 1024 * MiB
    max_waiters: int = 10_000
    long_poll_timeout_s: float = 20.0
    sse_max_connection_s: float = 60.0
    read_chunk_bytes: int = 4 * MiB
    snapshot_every_bytes: int = 256 * MiB
    log_level: str = "info"
    # Cold tier.
    cold_store: str = "local"
    s3_bucket: str = ""
    s3_prefix: str = ""
    s3_endpoint: str = ""
    s3_region: str = ""
    s3_path_style: bool = False
    take_over_prefix: bool = False
    flush_interval_s: float = 1.0
    flush_bytes: int = 8 * MiB
    cold_object_bytes: int = 16 * MiB
    hot_retention_s: float = 60.0
    read_cache_bytes: int = 64 * MiB
    cold_read_timeout_s: float = 5.0
    store_probe_interval_s: float = 5.0
    # GC and administration.
    gc_interval_s: float = 60.0
    gc_grace_s: float = 300.0
    gc_max_objects_per_pass: int = 1000
    reconcile_interval_s: float = 3600.0
    admin_token_file: str = ""
    # Subscriptions.
    webhooks: bool = True
    webhook_allow_loopback: bool = False
    public_url: str = ""

    def validate(self) -> None:
        if self.fsync not in ("always", "interval"):
            raise ConfigError("fsync must be 'always' or 'interval'")
        if not 0 < self.port < 65536:
            raise ConfigError("port must be between 1 and 65535")
        if self.segment_bytes < 1 * MiB:
            raise ConfigError("segment_bytes must be at least 1 MiB")
        if self.max_body_bytes + 4096 > self.segment_bytes:
            raise ConfigError("max_body_bytes must fit in one segment (segment_bytes)")
        for name in ("fsync_interval_ms", "max_hot_bytes", "max_waiters", "read_chunk_bytes", "snapshot_every_bytes"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.long_poll_timeout_s <= 0 or self.sse_max_connection_s <= 0:
            raise ConfigError("timeouts must be positive")
        if self.cold_store not in ("local", "s3"):
            raise ConfigError("cold_store must be 'local' or 's3'")
        if self.cold_store == "s3" and not self.s3_bucket:
            raise ConfigError("cold_store = 's3' needs s3_bucket")
        if self.flush_interval_s <= 0 or self.flush_bytes <= 0 or self.cold_object_bytes <= 0:
            raise ConfigError("flush_interval_s, flush_bytes and cold_object_bytes must be positive")
        if self.gc_interval_s <= 0 or self.gc_grace_s < 0 or self.gc_max_objects_per_pass <= 0:
            raise ConfigError("gc_interval_s and gc_max_objects_per_pass must be positive, gc_grace_s not negative")
        if self.cold_read_timeout_s <= 0 or self.store_probe_interval_s <= 0:
            raise ConfigError("cold_read_timeout_s and store_probe_interval_s must be positive")
        if self.hot_retention_s < 0 or self.read_cache_bytes < 0:
            raise ConfigError("hot_retention_s and read_cache_bytes must not be negative")

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    def admin_token(self, env: Mapping[str, str] | None = None) -> str | None:
        """The admin bearer token: from a file, or ``TIERED_ADMIN_TOKEN`` (never a flag value)."""
        env = os.environ if env is None else env
        if self.admin_token_file:
            try:
                token = Path(self.admin_token_file).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read admin token file: {exc}") from None
            if not token:
                raise ConfigError("the admin token file is empty")
            return token
        token = env.get("TIERED_ADMIN_TOKEN", "").strip()
        return token or None

    @property
    def loopback_only(self) -> bool:
        """True when the server can only be reached from this machine."""
        return self.host in ("localhost", "::1") or self.host.startswith("127.")


class ConfigError(ValueError):
    pass


def _coerce(field_type: Any, raw: Any, name: str) -> Any:
    kind = field_type if isinstance(field_type, type) else {"int": int, "float": float, "str": str, "bool": bool}.get(str(field_type))
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off", ""):
            return False
        raise ConfigError(f"{name}: expected true or false, got {raw!r}")
    try:
        if kind is int:
            return int(raw)
        if kind is float:
            return float(raw)
        return str(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: cannot use {raw!r}") from None


def load_config(file: str | None = None, env: Mapping[str, str] | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Build a ``Config`` from file, environment and explicit overrides."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    known = {f.name: f for f in fields(Config)}
    file = file or env.get("TIERED_CONFIG")
    if file:
        try:
            with open(file, "rb") as f:
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {file}: {exc}") from None
        section = data.get("tiered", data)
        for key, raw in section.items():
            key = key.replace("-", "_")
            if key not in known:
                raise ConfigError(f"{file}: unknown setting {key!r}")
            values[key] = _coerce(known[key].type, raw, key)
    for name, fld in known.items():
        raw = env.get("TIERED_" + name.upper())
        if raw is not None:
            values[name] = _coerce(fld.type, raw, "TIERED_" + name.upper())
    for name, raw in (overrides or {}).items():
        if raw is not None:
            values[name] = _coerce(known[name].type, raw, name)
    config = dataclasses.replace(Config(), **values)
    config.validate()
    return config
