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
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tiered.core.hosts import UnresolvableHost, all_loopback, listen_addresses

MiB = 1024 * 1024


SERVE = ("serve",)
ALL = ("serve", "verify", "gc")
STORE = ALL
OFFLINE_GC = ("serve", "gc")

ADDRESSING_STYLES = ("auto", "path", "virtual")
CHECKSUM_MODES = ("auto", "when_supported", "when_required")
CONDITIONAL_WRITES = ("probe", "off")
DURABILITY_MODES = ("local", "object-store")
ACCESS_LOG_MODES = ("off", "errors", "all")


def setting(default: Any, help: str, commands: tuple[str, ...] = SERVE) -> Any:
    """A configuration field: its default, what it does, and which commands use it (``--help`` shows only those)."""
    return field(default=default, metadata={"help": help, "commands": commands})


@dataclass
class Config:
    host: str = setting(
        "127.0.0.1",
        "address to listen on, or a host name (resolved at start-up; the server listens on every address "
        "it names)",
    )
    port: int = setting(4437, "TCP port to listen on")
    http_server: str = setting(
        "granian",
        "'granian' (HTTP/1.1 and HTTP/2, TLS; the faster, see docs/benchmarks.md) or 'aiohttp' (HTTP/1.1 only)",
    )
    tls_cert: str = setting("", "PEM certificate chain: serve HTTPS (HTTP/2 by ALPN) with --tls-key")
    tls_key: str = setting("", "PEM private key for --tls-cert")
    data_dir: str = setting(
        "./tiered-data", "directory for hot segments, snapshots and the local object store", ALL
    )
    fsync: str = setting(
        "always",
        "'always': acknowledge appends after fdatasync (survives power loss); 'interval': acknowledge after "
        "write(), fdatasync every --fsync-interval-ms (survives a crash of the process, not of the machine)",
    )
    fsync_interval_ms: int = setting(50, "how often 'interval' mode syncs, in ms")
    segment_bytes: int = setting(64 * MiB, "hot segment size before it rolls and seals", OFFLINE_GC)
    max_body_bytes: int = setting(16 * MiB, "largest request body accepted; larger gets 413")
    max_hot_bytes: int = setting(
        8 * 1024 * MiB, "cap on bytes held only in the hot tier; beyond it appends get 503 + Retry-After"
    )
    max_waiters: int = setting(10_000, "cap on concurrent long-poll/SSE readers; beyond it 503")
    long_poll_timeout_s: float = setting(20.0, "how long a long-poll waits before 204")
    sse_max_connection_s: float = setting(
        60.0, "SSE connections close after this long so caches can collapse"
    )
    read_chunk_bytes: int = setting(
        4 * MiB, "largest body a catch-up read returns; clients follow Stream-Next-Offset"
    )
    snapshot_every_bytes: int = setting(
        256 * MiB, "journal bytes between state snapshots (bounds restart replay time)"
    )
    log_level: str = setting("info", "debug, info, warning or error", ALL)
    log_format: str = setting(
        "text",
        "'text' (time LEVEL logger: message) or 'json' (one JSON object per line, with request ids)",
        ALL,
    )
    access_log: str = setting(
        "errors",
        "one structured log line per request: 'errors' (refused or failed requests, status >= 400, and clients "
        "that left before their answer), 'all' (every request), or 'off'. Lines carry the request id, method, "
        "route, bucket, status, error code and duration, never a credential, header or query value",
    )
    # Cold tier.
    cold_store: str = setting(
        "local", "where sealed data goes: 'local' (a directory under the data dir) or 's3'", STORE
    )
    s3_bucket: str = setting(
        "",
        "S3 bucket for cold objects (credentials come from the standard AWS chain: env, profile, role)",
        STORE,
    )
    s3_prefix: str = setting("", "key prefix for this server's cold objects inside the bucket", STORE)
    s3_endpoint: str = setting(
        "", "endpoint URL for S3-compatible stores (Ceph RGW, MinIO...); empty for AWS", STORE
    )
    s3_region: str = setting("", "S3 region (empty: from the AWS chain)", STORE)
    s3_addressing_style: str = setting(
        "auto",
        "how the bucket is addressed: 'path' (https://host/bucket/key; most S3-compatible stores, Ceph RGW, "
        "MinIO), 'virtual' (https://bucket.host/key) or 'auto' (virtual where the bucket name allows it)",
        STORE,
    )
    s3_path_style: bool = setting(False, "deprecated: same as s3_addressing_style = 'path'", STORE)
    s3_ca_bundle: str = setting(
        "",
        "PEM file of the CAs that sign the store's TLS certificate (a private CA); empty: the system's CAs "
        "(or AWS_CA_BUNDLE)",
        STORE,
    )
    s3_checksum_mode: str = setting(
        "auto",
        "request checksums: 'when_supported' (CRC32 on every upload, aws-chunked; AWS), 'when_required' "
        "(Content-MD5 on every upload; what S3-compatible stores take, e.g. Ceph RGW over HTTPS), or 'auto' "
        "(when_supported on AWS, when_required with s3_endpoint)",
        STORE,
    )
    s3_conditional_writes: str = setting(
        "probe",
        "'probe': at start-up check with a throwaway object that the store refuses If-None-Match and stale "
        "If-Match writes, and refuse to start if it ignores them; 'off': skip the check (UNSAFE on a store "
        "that ignores them: a second server on the same prefix is not refused and deletes this one's objects; "
        "see README)",
    )
    take_over_prefix: bool = setting(
        False,
        "claim the object-store prefix even though another data dir holds it (only when that data dir is gone "
        "for good: its objects become orphans here and are deleted after the grace delay)",
    )
    flush_interval_s: float = setting(1.0, "how often durable hot data is flushed to the cold tier")
    flush_bytes: int = setting(8 * MiB, "flush early once this many bytes are waiting")
    cold_object_bytes: int = setting(16 * MiB, "target size of one cold object")
    hot_retention_s: float = setting(
        60.0, "keep hot copies this long after they are cold (0: drop them at once)", OFFLINE_GC
    )
    read_cache_bytes: int = setting(64 * MiB, "memory for cached Parquet footers and row groups")
    cold_read_timeout_s: float = setting(
        5.0, "a cold read the object store has not answered by then gets 503 + Retry-After"
    )
    store_probe_interval_s: float = setting(5.0, "how often the object store is probed for /readyz")
    # Idempotent producers (tiered/engine/streams/producers.py). They decide what replay rebuilds: keep them
    # the same for every command (and every node of a cluster) that opens a data dir.
    producer_ttl_s: float = setting(
        7 * 86400.0,
        "an idempotent producer's state (epoch, sequence) is dropped this long after its last accepted "
        "append; its next append is treated as a new producer's (protocol 5.2.1)",
        ALL,
    )
    max_producers_per_stream: int = setting(
        1000,
        "producer states one stream keeps; a new producer beyond it evicts the longest idle one's",
        ALL,
    )
    # GC and administration.
    gc_interval_s: float = setting(60.0, "how often the server runs a GC pass (expiry, retention, deletion)")
    gc_grace_s: float = setting(
        300.0, "how long an object nobody owns waits before it is deleted", OFFLINE_GC
    )
    gc_max_objects_per_pass: int = setting(
        1000, "bound on objects deleted (and orphans handled) per GC pass", OFFLINE_GC
    )
    reconcile_interval_s: float = setting(
        3600.0, "how often a GC pass also lists the object store to find orphans"
    )
    admin_token_file: str = setting(
        "",
        "file holding the admin bearer token (or set TIERED_ADMIN_TOKEN); without one, admin operations are "
        "refused (403), except with auth off ('none' or unset) on a loopback address",
        OFFLINE_GC,
    )
    # Tenants: authentication, quotas, usage.
    auth: str = setting(
        "",
        "who may use the data plane: 'tokens' (bearer tokens tiered issues per bucket), 'jwt' (JWTs from your "
        "identity provider, and tiered's tokens), 'none' (anyone who can connect; logged as a warning off "
        "loopback); unset: open on loopback, and the server refuses to start on any other address. With "
        "'tokens' or 'jwt' the admin routes need the admin token wherever the server listens",
    )
    jwks_file: str = setting(
        "", "JWKS file with the identity provider's public keys (reloaded on change, SIGHUP)"
    )
    jwt_issuer: str = setting("", "the 'iss' every JWT must carry")
    jwt_audience: str = setting("", "the 'aud' every JWT must include")
    jwt_leeway_s: int = setting(0, "clock skew allowed when checking a JWT's exp and nbf, in seconds")
    jwt_scope_claim: str = setting(
        "scope", "JWT claim holding 'tiered:<bucket>:<read|write|admin>[:<prefix>]' items"
    )
    quota_max_streams: int = setting(0, "default quota: streams per bucket (0: unlimited)")
    quota_max_retained_bytes: int = setting(
        0, "default quota: retained bytes per bucket, hot plus cold (0: unlimited)"
    )
    quota_append_bytes_per_s: int = setting(
        0, "default quota: appended bytes per second per bucket (0: unlimited)"
    )
    quota_append_requests_per_s: int = setting(
        0, "default quota: append requests per second per bucket (0: unlimited)"
    )
    quota_max_live_readers: int = setting(
        0, "default quota: concurrent long-poll/SSE readers per bucket (0: unlimited)"
    )
    quota_max_body_bytes: int = setting(0, "default quota: request body bytes per bucket (0: max_body_bytes)")
    usage_interval_s: float = setting(
        10.0, "how often egress and request counts are journaled (a crash loses at most this much of them)"
    )
    usage_log: str = setting("", "JSON Lines usage log for billing export, one line per bucket per interval")
    usage_log_max_bytes: int = setting(64 * MiB, "rotate the usage log at this size")
    usage_log_rotate_s: float = setting(86400.0, "rotate the usage log at this age")
    metrics_max_buckets: int = setting(
        100, 'buckets with a label of their own in /metrics (the rest are summed as bucket="_other")'
    )
    # Subscriptions.
    webhooks: bool = setting(True, "deliver webhook subscriptions")
    webhook_allow_loopback: bool = setting(
        False,
        "let webhooks target loopback (http://localhost, 127.x) for local development (anyone who can create "
        "a subscription could otherwise reach this machine's local services)",
    )
    public_url: str = setting(
        "", "base URL clients reach this server at, for callback and JWKS URLs (empty: from the request)"
    )
    # Cluster mode (docs/cluster.md): several nodes on one object-store prefix, shards held by leases.
    cluster_node_id: str = setting(
        "",
        "this node's id in a cluster (empty: a single server). Every node of a cluster shares cold_store = 's3' "
        "with the same bucket and prefix; restart a node under the same id with the same data dir",
    )
    cluster_advertise_url: str = setting(
        "", "base URL other nodes forward requests to (empty: http://HOST:PORT of this listener)"
    )
    cluster_shards: int = setting(
        64, "number of shards, fixed when the cluster is created (later nodes must give the same number)"
    )
    cluster_secret_file: str = setting(
        "",
        "file holding the secret that signs node-to-node requests (at least 32 characters, the same on every "
        "node: e.g. from Secrets Manager or SSM); empty: the secret object the first node creates in the store",
    )
    cluster_lease_ttl_s: float = setting(
        10.0,
        "how long a node's heartbeat keeps its shard leases valid; a silent node is declared dead after it",
    )
    cluster_lease_margin_s: float = setting(
        0.0, "safety margin on each side of the lease TTL (0: a fifth of the TTL)"
    )
    durability: str = setting(
        "local",
        "'local': acknowledge after fsync on this node's disk; 'object-store' (cluster mode): acknowledge only "
        "after the shard's write-ahead log object is in the object store, so losing a node loses nothing",
    )
    cluster_wal_interval_ms: int = setting(
        200, "object-store durability: how long appends of one shard are gathered into one WAL object"
    )
    cluster_locator_ttl_s: float = setting(
        5.0,
        "how long a node may answer catch-up reads of another node's stream from the object store with the "
        "cold locators the owner gave it (0: always forward; at most half of gc_grace_s)",
    )
    cluster_fork_pin_grace_s: float = setting(
        600.0,
        "a cross-shard fork's pin (in its source's shard) whose fork is gone is deleted once it is this old "
        "(longer than any fork's creation may take)",
    )
    cluster_fork_pin_sweep_s: float = setting(
        60.0, "how often each node looks for cross-shard fork pins whose fork is gone"
    )
    cluster_usage_interval_s: float = setting(
        1.0,
        "how often each node publishes its shards' usage and reads the others' (bucket-wide quotas may be "
        "exceeded by what other nodes admit within about two intervals: docs/cluster.md)",
    )
    # Worker processes (docs/workers.md): one node served by several processes sharing its port.
    workers: int = setting(
        1,
        "worker processes serving this node, sharing its port and splitting its shards (0: one per CPU core; "
        "1: a single process). A data dir is laid out for one process or for workers: it keeps its layout",
    )
    worker_shards: int = setting(
        16,
        "with workers: the node's shard count, fixed when the data dir is first served with workers "
        "(at least the number of workers you will run)",
    )
    # Stream snapshots and bootstrap reads (docs/snapshots.md).
    stream_snapshot_max_bytes: int = setting(
        16 * MiB, "largest stream snapshot a writer may publish (at most max_body_bytes); larger gets 413"
    )
    bootstrap_max_bytes: int = setting(
        16 * MiB, "most update bytes one bootstrap read returns after the snapshot; then it is partial"
    )

    # Erasure that reaches every byte, and cold-object rewrites (issue 21: tiered/engine/jobs/rewrite.py).
    erasure_deadline_s: float = setting(
        86400.0,
        "an erased bucket's rows are gone from every cold object (shared ones rewritten without them, the old "
        "ones deleted) within this long of the erasure; GET /v1/admin/erasure reports, tiered verify checks",
        ALL,
    )
    rewrite_max_objects_per_pass: int = setting(
        16, "bound on cold objects rewritten per GC pass (erasure rewrites)", OFFLINE_GC
    )
    rewrite_bytes_per_s: int = setting(
        16_000_000,
        "pace of cold-object rewrites, bytes read plus written per second (0: unpaced), so appends keep "
        "their share of the machine",
        OFFLINE_GC,
    )

    # Keyed compaction with tombstones (issue 21: gc/compaction.py, docs/compaction.md).
    compaction_tombstone_delay_s: float = setting(
        86400.0, "a tombstone of a keyed stream is removed by compaction once stored this long", OFFLINE_GC
    )

    # Large bodies stored by reference (issue 22, docs/large-bodies.md).
    large_body_threshold_bytes: int = setting(
        8 * MiB,
        "an append whose Content-Length is above this is streamed to an object of its own in the store and "
        "journaled as a reference (0: off; every body goes through the journal, up to max_body_bytes)",
    )
    large_body_max_bytes: int = setting(
        5 * 1024 * MiB, "largest body stored by reference; larger gets 413 (at most 5 TiB, S3's object limit)"
    )

    # Checkpoints and restores (object-store durability; docs/cluster.md, "Checkpoints and restore").
    cluster_checkpoint_max_objects: int = setting(
        16,
        "object-store durability: a shard's owner writes a checkpoint object once its live bytes are in this many "
        "WAL objects, so a new owner restores from the checkpoint objects plus at most this many WAL objects",
    )
    cluster_checkpoint_max_mib: int = setting(
        32, "object-store durability: ... or once the live bytes in those WAL objects reach this many MiB"
    )
    cluster_restore_concurrency: int = setting(
        16, "object-store durability: how many objects a restoring shard fetches from the store at once"
    )

    def validate(self) -> None:
        if self.fsync not in ("always", "interval"):
            raise ConfigError("fsync must be 'always' or 'interval'")
        if self.log_format not in ("text", "json"):
            raise ConfigError("log_format must be 'text' or 'json'")
        if self.access_log not in ACCESS_LOG_MODES:
            raise ConfigError(f"access_log must be one of {', '.join(ACCESS_LOG_MODES)}")
        if not self.host.strip():
            raise ConfigError("host must not be empty: give an address (127.0.0.1, 0.0.0.0, ::) or a name")
        if self.http_server not in ("granian", "aiohttp"):
            raise ConfigError("http_server must be 'granian' or 'aiohttp'")
        if bool(self.tls_cert) != bool(self.tls_key):
            raise ConfigError("tls_cert and tls_key go together: give both or neither")
        if self.tls_cert and self.http_server != "granian":
            raise ConfigError("TLS is served by http_server = 'granian'")
        for name in ("tls_cert", "tls_key"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ConfigError(f"{name} {path!r} is not a readable file")
        if not 0 < self.port < 65536:
            raise ConfigError("port must be between 1 and 65535")
        if self.segment_bytes < 1 * MiB:
            raise ConfigError("segment_bytes must be at least 1 MiB")
        if self.max_body_bytes + 4096 > self.segment_bytes:
            raise ConfigError("max_body_bytes must fit in one segment (segment_bytes)")
        for name in (
            "fsync_interval_ms",
            "max_hot_bytes",
            "max_waiters",
            "read_chunk_bytes",
            "snapshot_every_bytes",
            "stream_snapshot_max_bytes",
            "bootstrap_max_bytes",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if self.long_poll_timeout_s <= 0 or self.sse_max_connection_s <= 0:
            raise ConfigError("timeouts must be positive")
        if self.cold_store not in ("local", "s3"):
            raise ConfigError("cold_store must be 'local' or 's3'")
        if self.cold_store == "s3" and not self.s3_bucket:
            raise ConfigError("cold_store = 's3' needs s3_bucket")
        if self.s3_addressing_style not in ADDRESSING_STYLES:
            raise ConfigError(f"s3_addressing_style must be one of {', '.join(ADDRESSING_STYLES)}")
        if self.s3_path_style and self.s3_addressing_style not in ("auto", "path"):
            raise ConfigError(
                f"s3_path_style = true contradicts s3_addressing_style = {self.s3_addressing_style!r} "
                "(s3_path_style is deprecated: set only s3_addressing_style)"
            )
        if self.s3_checksum_mode not in CHECKSUM_MODES:
            raise ConfigError(f"s3_checksum_mode must be one of {', '.join(CHECKSUM_MODES)}")
        if self.s3_conditional_writes not in CONDITIONAL_WRITES:
            raise ConfigError(f"s3_conditional_writes must be one of {', '.join(CONDITIONAL_WRITES)}")
        if self.s3_ca_bundle and not Path(self.s3_ca_bundle).is_file():
            raise ConfigError(f"s3_ca_bundle: no such file: {self.s3_ca_bundle}")
        if self.flush_interval_s <= 0 or self.flush_bytes <= 0 or self.cold_object_bytes <= 0:
            raise ConfigError("flush_interval_s, flush_bytes and cold_object_bytes must be positive")
        if self.gc_interval_s <= 0 or self.gc_grace_s < 0 or self.gc_max_objects_per_pass <= 0:
            raise ConfigError(
                "gc_interval_s and gc_max_objects_per_pass must be positive, gc_grace_s not negative"
            )
        if self.cold_read_timeout_s <= 0 or self.store_probe_interval_s <= 0:
            raise ConfigError("cold_read_timeout_s and store_probe_interval_s must be positive")
        if self.hot_retention_s < 0 or self.read_cache_bytes < 0:
            raise ConfigError("hot_retention_s and read_cache_bytes must not be negative")
        if self.durability not in DURABILITY_MODES:
            raise ConfigError(f"durability must be one of {', '.join(DURABILITY_MODES)}")
        if self.cluster_node_id:
            if self.cold_store != "s3":
                raise ConfigError(
                    "cluster mode (cluster_node_id) needs cold_store = 's3': nodes share the bucket"
                )
            if not 1 <= self.cluster_shards <= 4096:
                raise ConfigError("cluster_shards must be between 1 and 4096")
            margin = self.lease_margin_s
            if not (self.cluster_lease_ttl_s > 0 and 0 < margin < self.cluster_lease_ttl_s / 2):
                raise ConfigError(
                    "cluster_lease_ttl_s must be positive, cluster_lease_margin_s below half of it"
                )
            if self.cluster_wal_interval_ms <= 0:
                raise ConfigError("cluster_wal_interval_ms must be positive")
            if self.cluster_locator_ttl_s < 0:
                raise ConfigError("cluster_locator_ttl_s must not be negative (0: off)")
            if not (self.cluster_fork_pin_grace_s > 0 and self.cluster_fork_pin_sweep_s > 0):
                raise ConfigError("cluster_fork_pin_grace_s and cluster_fork_pin_sweep_s must be positive")
            if not self.cluster_usage_interval_s > 0:
                raise ConfigError("cluster_usage_interval_s must be positive")
            self._validate_checkpoints()
        elif self.durability != "local":
            raise ConfigError("durability = 'object-store' needs cluster mode (cluster_node_id)")
        if self.auth not in ("", "none", "tokens", "jwt"):
            raise ConfigError("auth must be 'tokens', 'jwt' or 'none'")
        if self.auth == "jwt":
            for name in ("jwks_file", "jwt_issuer", "jwt_audience"):
                if not getattr(self, name):
                    raise ConfigError(f"auth = 'jwt' needs {name} (--{name.replace('_', '-')})")
            if not Path(self.jwks_file).is_file():
                raise ConfigError(f"jwks_file {self.jwks_file!r} is not a readable file")
        if self.jwt_leeway_s < 0:
            raise ConfigError("jwt_leeway_s must not be negative")
        for name in (
            "quota_max_streams",
            "quota_max_retained_bytes",
            "quota_append_bytes_per_s",
            "quota_append_requests_per_s",
            "quota_max_live_readers",
            "quota_max_body_bytes",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must not be negative (0 is unlimited)")
        if self.usage_interval_s <= 0 or self.usage_log_max_bytes <= 0 or self.usage_log_rotate_s <= 0:
            raise ConfigError("usage_interval_s, usage_log_max_bytes and usage_log_rotate_s must be positive")
        if not (self.producer_ttl_s >= 0.001 and self.max_producers_per_stream >= 1):
            raise ConfigError("producer_ttl_s must be at least 0.001 and max_producers_per_stream at least 1")
        if self.metrics_max_buckets < 0:
            raise ConfigError("metrics_max_buckets must not be negative")
        self._validate_workers()
        self._validate_rewrites()
        self._validate_large_bodies()

    def _validate_workers(self) -> None:
        if self.workers < 0:
            raise ConfigError("workers must not be negative (0: one per CPU core)")
        if not 1 <= self.worker_shards <= 4096:
            raise ConfigError("worker_shards must be between 1 and 4096")
        if self.worker_count() == 1:
            return
        if self.cluster_node_id:
            raise ConfigError("workers: a cluster node (cluster_node_id) runs as one process (workers = 1)")
        if self.http_server != "granian":
            raise ConfigError("workers share their port through http_server = 'granian'")

    def worker_count(self) -> int:
        """The worker processes to run (``workers``, 0 resolved to the CPU cores this process may use)."""
        if self.workers:
            return self.workers
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # not on Linux
            return max(1, os.cpu_count() or 1)

    def _validate_rewrites(self) -> None:
        """Erasure and cold-object rewrites (issue 21)."""
        if self.rewrite_max_objects_per_pass <= 0 or self.erasure_deadline_s <= 0:
            raise ConfigError("rewrite_max_objects_per_pass and erasure_deadline_s must be positive")
        if self.rewrite_bytes_per_s < 0:
            raise ConfigError("rewrite_bytes_per_s must not be negative (0: unpaced)")
        if self.gc_grace_s >= self.erasure_deadline_s:
            raise ConfigError(
                "gc_grace_s must be below erasure_deadline_s: an erased bucket's old objects wait out the "
                "grace delay before they are deleted"
            )

    def _validate_large_bodies(self) -> None:
        if self.large_body_threshold_bytes < 0:
            raise ConfigError("large_body_threshold_bytes must not be negative (0: off)")
        if self.large_body_threshold_bytes and not (
            self.large_body_threshold_bytes < self.large_body_max_bytes <= 5 * 1024 * 1024 * MiB
        ):
            raise ConfigError(
                "large_body_max_bytes must be above large_body_threshold_bytes and at most 5 TiB"
            )

    def _validate_checkpoints(self) -> None:
        """Checkpoints and restores (object-store durability)."""
        counts = (self.cluster_checkpoint_max_objects, self.cluster_checkpoint_max_mib)
        if min(*counts, self.cluster_restore_concurrency) < 1:
            raise ConfigError(
                "cluster_checkpoint_max_objects, cluster_checkpoint_max_mib and cluster_restore_concurrency "
                "must be at least 1"
            )

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir)

    @property
    def lease_margin_s(self) -> float:
        """The lease margin in effect (``cluster_lease_margin_s``, or a fifth of the TTL)."""
        return self.cluster_lease_margin_s or self.cluster_lease_ttl_s / 5

    @property
    def locator_valid_ms(self) -> int:
        """How long a cold locator may be used (cluster mode): below the GC grace, which keeps its objects."""
        if not self.cluster_node_id:
            return 0
        return int(min(self.cluster_locator_ttl_s, self.gc_grace_s / 2) * 1000)

    @property
    def s3_addressing(self) -> str:
        """The addressing style in effect, with the deprecated ``s3_path_style`` folded in."""
        return "path" if self.s3_path_style else self.s3_addressing_style

    def deprecations(self) -> list[str]:
        """Settings in use that are deprecated, each with what to use instead (logged at start-up)."""
        if self.s3_path_style:
            return [
                "s3_path_style is deprecated: use s3_addressing_style = 'path' (--s3-addressing-style path)"
            ]
        return []

    def cluster_secret(self) -> bytes | None:
        """The node-to-node secret from ``cluster_secret_file`` (None: the store's secret object is used)."""
        if not self.cluster_secret_file:
            return None
        try:
            text = Path(self.cluster_secret_file).read_text().strip()
        except OSError as exc:
            raise ConfigError(f"cannot read cluster secret file: {exc}") from None
        if len(text) < 32:
            raise ConfigError("the cluster secret file must hold at least 32 characters")
        return text.encode()

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
    def auth_mode(self) -> str:
        """The auth in force: unset means 'none' (``serve`` refuses unset off loopback: ``exposure_problem``)."""
        return self.auth or "none"

    def exposure_problem(self) -> str | None:
        """Why serving would expose an open server by accident, or None."""
        if self.auth or self.loopback_only:
            return None
        return (
            f"refusing to listen on {self.host} without authentication: choose --auth tokens|jwt|none "
            "(or TIERED_AUTH, or auth in the config file); --auth none serves everyone who can connect"
        )

    @property
    def loopback_only(self) -> bool:
        """True when the server can only be reached from this machine: every address ``host`` names is loopback.

        A name is resolved (``tiered.core.hosts``); one that does not resolve is not
        loopback (and ``serve`` refuses to start on it).
        """
        try:
            return all_loopback(listen_addresses(self.host))
        except UnresolvableHost:
            return False

    @property
    def admin_open_without_token(self) -> bool:
        """Whether admin routes are open when no admin token is configured: only with auth off, on loopback.

        With auth on (``tokens``, ``jwt``) the operator chose credentials, so the
        admin API needs the admin token wherever the server listens: a local
        reverse proxy or sidecar must not make it anyone's.
        """
        return self.auth_mode == "none" and self.loopback_only

    def exposure_warnings(self, admin_token_configured: bool) -> list[str]:
        """What the operator must hear at start-up about who can reach what (logged as warnings)."""
        warnings = []
        if self.auth_mode == "none" and not self.loopback_only:
            warnings.append(
                f"auth is off (--auth none) on {self.host}: the data plane is open, anyone who can connect can "
                "read, append to and delete every stream; use --auth tokens|jwt unless a proxy in front "
                "authenticates every request"
            )
        if not admin_token_configured and not self.admin_open_without_token:
            why = f"--auth {self.auth_mode}" if self.auth_mode != "none" else f"listening on {self.host}"
            warnings.append(
                f"no admin token is configured ({why}): the admin routes (/v1/admin/..., bucket erasure, "
                "/metrics) answer 403; set one with --admin-token-file FILE or TIERED_ADMIN_TOKEN"
            )
        return warnings


class ConfigError(ValueError):
    pass


def _coerce(field_type: Any, raw: Any, name: str) -> Any:
    kind = (
        field_type
        if isinstance(field_type, type)
        else {"int": int, "float": float, "str": str, "bool": bool}.get(str(field_type))
    )
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


def load_config(
    file: str | None = None, env: Mapping[str, str] | None = None, overrides: dict[str, Any] | None = None
) -> Config:
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
