"""Every ``QUEEN_*`` setting, declared once: name, type, default, range and meaning.

The supervisor resolves the settings (defaults < environment < command line), then exports the
resolved values back into the environment of its children, so a shard process and a gunicorn
front worker read exactly what the supervisor decided. The CLI options and the README table are
generated from ``SETTINGS``; nothing else reads ``os.environ`` for configuration.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["SETTINGS", "Config", "ConfigError", "Setting", "settings_table_markdown"]


class ConfigError(ValueError):
    """A setting has an invalid value; the message names the variable."""


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_bool(raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"expected one of {sorted(_TRUE | _FALSE)}")


@dataclass(frozen=True)
class Setting:
    """One knob: the env variable, its Python type and what it means."""

    env: str
    attr: str
    kind: type
    default: Any
    help: str
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] | None = None
    secret: bool = False

    @property
    def cli_flag(self) -> str:
        return "--" + self.attr.replace("_", "-")

    @property
    def default_text(self) -> str:
        """The default as the environment would spell it; "(empty)" for an empty string."""
        return self.render(self.default) if self.default != "" else "(empty)"

    @property
    def range_text(self) -> str:
        """The accepted values ("" when any value of the type is)."""
        rng = []
        if self.choices:
            rng.append(" / ".join(self.choices))
        if self.minimum is not None:
            rng.append(f">= {self.minimum:g}")
        if self.maximum is not None:
            rng.append(f"<= {self.maximum:g}")
        if self.kind is bool:
            rng.append("0 / 1")
        return ", ".join(rng)

    def parse(self, raw: Any) -> Any:
        """Parse and validate; raise ConfigError naming the variable."""
        try:
            if isinstance(raw, str):
                if self.kind is bool:
                    value: Any = _parse_bool(raw)
                elif self.kind is int:
                    value = int(raw.strip(), 10)
                elif self.kind is float:
                    value = float(raw.strip())
                else:
                    value = raw
            else:
                value = self.kind(raw)
        except (TypeError, ValueError) as ex:
            kind = self.kind.__name__
            raise ConfigError(f"{self.env}={raw!r}: not a valid {kind} ({ex})") from ex
        if self.minimum is not None and value < self.minimum:
            raise ConfigError(f"{self.env}={value!r}: must be >= {self.minimum:g}")
        if self.maximum is not None and value > self.maximum:
            raise ConfigError(f"{self.env}={value!r}: must be <= {self.maximum:g}")
        if self.choices is not None and value not in self.choices:
            raise ConfigError(f"{self.env}={value!r}: must be one of {', '.join(self.choices)}")
        return value

    def render(self, value: Any) -> str:
        if self.kind is bool:
            return "1" if value else "0"
        return str(value)


def _s(env: str, kind: type, default: Any, help: str, **kw: Any) -> Setting:
    return Setting(env=env, attr=env.removeprefix("QUEEN_").lower(), kind=kind, default=default,
                   help=help, **kw)


SETTINGS: tuple[Setting, ...] = (
    # --- listener and processes
    _s("QUEEN_HOST", str, "127.0.0.1", "Address the HTTP listener binds; loopback by default."),
    _s("QUEEN_PORT", int, 6632, "HTTP port.", minimum=0, maximum=65535),
    _s("QUEEN_WORKERS", int, 2, "Gunicorn front worker processes (HTTP edge).",
       minimum=1, maximum=64),
    _s("QUEEN_V2_FUSION_SHARDS", int, 1,
       "Shard processes owning partitions (push fusion, ack fusion, ack registry); about one "
       "per 4 cores (on 2 cores one shard pushed 1.2-1.7x more than two: bigger bundles, one "
       "process less competing with the front workers).",
       minimum=1, maximum=64),
    _s("QUEEN_OPTIMIZE", bool, True,
       "Run the broker at Python's optimization level 2: `serve` re-executes itself with -OO "
       "(same pid, arguments and environment) unless already so, and the image the "
       "supervisor preloads for its children has no docstrings (nor asserts): its small "
       "objects 25.0 -> 23.8 MB, its glibc heap in use 13.0 -> 10.3 MB. -OO reads "
       "`.opt-2.pyc` files, which pip does not write (docs/operations.md section 0). "
       "0 = the interpreter's level as started."),
    _s("QUEEN_MALLOC_MMAP_THRESHOLD_KB", int, 128,
       "glibc malloc: blocks of this size or more (request bodies, rendered answers) are "
       "mapped on their own and unmapped when freed; 0 = glibc's adaptive threshold, which "
       "climbs to the largest block freed so far and keeps those blocks' memory in the heap "
       "after a burst (peak PSS of a 1,000-item push burst 149 -> 143 MB, 13 MB less held "
       "after it).", minimum=0, maximum=32768),
    _s("QUEEN_INSTANCE_ID", str, "",
       "Name of this broker instance in metrics and logs; empty = hostname:port."),
    _s("QUEEN_LOG_LEVEL", str, "info", "Log level.",
       choices=("debug", "info", "warning", "error")),
    _s("QUEEN_SHUTDOWN_TIMEOUT_S", int, 30,
       "Graceful stop budget: in-flight requests finish and shards flush within it.",
       minimum=1, maximum=3600),
    # --- storage
    _s("QUEEN_DATA_DIR", str, "./var",
       "State directory: embedded PostgreSQL cluster (pg/), spool, metrics scratch, the dedup "
       "filters' spill files (dedup/)."),
    _s("QUEEN_PG_DSN", str, "",
       "libpq DSN of the PostgreSQL to use (multi-host allowed); empty = start an embedded "
       "cluster in $QUEEN_DATA_DIR/pg.", secret=True),
    _s("QUEEN_EMBEDDED_PG_PORT", int, 0,
       "Loopback port of the embedded cluster; 0 = pick a free one once and keep it.",
       minimum=0, maximum=65535),
    _s("QUEEN_PG_POOL_SIZE", int, 8, "PostgreSQL connections per front worker (pops, admin).",
       minimum=1, maximum=200),
    _s("QUEEN_PG_STATEMENT_TIMEOUT_MS", int, 30000,
       "Client-side deadline of a statement; past it the broker cancels it server-side and "
       "quarantines the connection.", minimum=100, maximum=3_600_000),
    _s("QUEEN_SPOOL_DIR", str, "", "Disk spool directory; empty = $QUEEN_DATA_DIR/spool."),
    _s("QUEEN_HOUSEKEEPING_S", int, 5,
       "Seconds between housekeeping rounds of each shard: segment retention, the "
       "transactionId sidecar purge, expired leases and KV keys.", minimum=1, maximum=3600),
    _s("QUEEN_METRICS_QUEUE_S", int, 15,
       "Seconds between refreshes of the per-queue gauges of /metrics/prometheus (depth, "
       "oldest unconsumed age, lag per consumer group, DLQ depth): one SQL call by shard 0 "
       "of each instance, read by every scrape.", minimum=1, maximum=3600),
    _s("QUEEN_METRICS_QUEUE_CAP", int, 100,
       "Series per per-queue gauge named by queue (by queue and group for the lag): the "
       "highest values; the rest are summed (ages: the highest) under queue=\"(other)\", "
       "and every tenant's but the default one's under \"(other tenants)\".",
       minimum=1, maximum=100_000),
    _s("QUEEN_DISK_HIGH_PCT", int, 85,
       "Push and transaction answer 507 above this filesystem use of the spool.",
       minimum=1, maximum=100),
    # --- push path
    _s("QUEEN_V2_BUNDLE_MAX", int, 64,
       "Most partitions committed together by one shard transaction.", minimum=1,
       maximum=10000),
    _s("QUEEN_DEDUP_FILTER_ENTRIES", int, 4_000_000,
       "Transaction hashes a shard's dedup filter keeps in memory, so the dedup probe skips "
       "what it knows. It counts hashes, not bytes: 4-5 bytes a hash in segments of "
       "1,000, 33-55 in segments of 1-10 over 1,000 partitions, about 220 in 1-item segments "
       "over 10,000 partitions (the hot set and each partition's overhead); 0 turns the "
       "filter off (every push probes the whole window). Past it, the runs of 512 hashes or "
       "more of the least recently pushed partitions go to the spill file "
       "(QUEEN_DEDUP_SPILL_BYTES), read back by the pushes that need them. Once that is full "
       "(or off), or nothing is left to spill, the least recently pushed partitions are "
       "forgotten, and a partition is then taken in (its window read back) only once pushed "
       "more often than the least recently pushed one (counts that halve every minute): one "
       "not remembered has every push probe its whole window in SQL (about 0.3 us of "
       "PostgreSQL CPU a stored hash; queen_dedup_sql_probes_total counts them). Five "
       "100-item rounds of the suite (10.4M hashes over 1,000 partitions): 4M against 8M "
       "kept the broker's peak PSS at 132.3 against 147.5 MB for 0.05-0.07 us more of the "
       "shard's CPU a message, neither probing in SQL.", minimum=0, maximum=400_000_000),
    _s("QUEEN_DEDUP_SPILL_BYTES", int, 2 << 30,
       "Bytes of local disk a shard's dedup filter may use past QUEEN_DEDUP_FILTER_ENTRIES "
       "(4 bytes a hash, in slots of power-of-two sizes): an unlinked file in "
       "$QUEEN_DATA_DIR/dedup, given back once empty. A partition whose runs lie there stays "
       "known, its pushes read them back from the page cache (one pread a run) instead of "
       "probing their window in SQL; queen_dedup_filter_spilled_entries counts them. "
       "0 = no spill file: past the bound partitions are forgotten.",
       minimum=0, maximum=1 << 40),
    _s("QUEEN_V2_FUSION_HOLD_MS", int, 15,
       "Liveness backstop tick of a shard while pushes are pending (it sleeps while none "
       "is), not a batching window.", minimum=1, maximum=10000),
    _s("QUEEN_V2_FUSION_MAX_INFLIGHT", int, 4,
       "Upper bound of the adaptive cap on bundles in flight per shard.", minimum=1,
       maximum=64),
    _s("QUEEN_V2_FUSION_FRAMES", int, 0,
       "Parsed and printed for compatibility; segment size is emergent, not a trigger.",
       minimum=0),
    _s("QUEEN_RING_KB", int, 1024,
       "Size of each request ring in shared memory (one per front worker x shard); each "
       "reply ring is an eighth of it, at least 64 KiB. Records larger than a ring are "
       "chunked; a ring's touched pages count in the RSS of both its ends (4,096 -> 1,024: "
       "13-18 MB less in all, push throughput unchanged).",
       minimum=64, maximum=1_048_576),
    _s("QUEEN_SPOOL_HOLD", bool, True,
       "Keep a producer's order per partition across spool drains: while a spool (this "
       "instance's or another's) holds records, a new push waits for the drain (up to 5 s, "
       "then it is spooled too) instead of being stored ahead of them. false: pushes go "
       "straight to PostgreSQL once it can take them, and buffered items may be stored "
       "after later ones (faster recovery after maintenance or an outage). Every instance "
       "over one database should use the same value (docs/architecture.md, Spool and order).",
       ),
    _s("QUEEN_DEDUP_WINDOW", int, 3600,
       "Default dedupWindow (s) of new queues; 0 = dedup off (acks still resolve).",
       minimum=0),
    _s("QUEEN_PUSH_TIMEOUT_MS", int, 30000,
       "A push without every verdict by then answers 503 timeout.", minimum=100,
       maximum=3_600_000),
    _s("QUEEN_ENCRYPTION_KEY", str, "",
       "AES-256-GCM key (64 hex chars) for queues with encryptionEnabled; set, it is the only "
       "key and no key file is read.", secret=True),
    _s("QUEEN_ENCRYPTION_KEY_FILE", str, "",
       "Key file of queues with encryptionEnabled: several keys, one current "
       "(docs/operations.md, Encryption keys; `queenctl keys`); empty = "
       "$QUEEN_DATA_DIR/encryption-keys.json."),
    _s("QUEEN_ENCRYPTION_KEY_CREATE", bool, True,
       "Without QUEEN_ENCRYPTION_KEY and with no key file, create one (mode 0600) with a random "
       "key at start, unless the database already knows keys of other instances."),
    # --- ack path
    _s("QUEEN_ACK_FUSION", bool, True, "Fold concurrent acks into one commit per shard."),
    _s("QUEEN_ACK_REGISTRY", bool, True,
       "Positional fast path for whole-batch completed acks by the lease holder."),
    _s("QUEEN_ACK_REGISTRY_MB", int, 64, "Memory bound of the ack registry per shard.",
       minimum=1, maximum=65536),
    # --- pop path
    _s("QUEEN_POP_WAKE_TICK_MS", int, 5,
       "Tick at which a front worker with parked pops looks at the shared wake board; "
       "wake-ups of one queue within a tick coalesce.", minimum=1, maximum=1000),
    _s("QUEEN_WAKE_NOTIFY", bool, True,
       "Send wake-ups to other broker instances over PostgreSQL LISTEN/NOTIFY (batched)."),
    _s("QUEEN_MAX_PARKED_POPS", int, 10000,
       "Parked long polls per front worker before pops answer 429.", minimum=1),
    # --- timers
    _s("QUEEN_TIMER_FIRED_RETENTION_S", int, 3600,
       "Fired (and cancelled) timers are remembered this long, so late reschedule and cancel "
       "calls answer too_late; then they are forgotten.", minimum=0),
    # --- limits and admission
    _s("QUEEN_MAX_BODY_MB", int, 64, "Largest request body after Content-Encoding.",
       minimum=1, maximum=4096),
    _s("QUEEN_MAX_DECOMPRESSED_MB", int, 256,
       "Largest decompressed zstd frame inside a binary body.", minimum=1, maximum=16384),
    _s("QUEEN_ADMIT_MAX_MB", int, 128,
       "Admission budget of in-flight write request bytes per front worker.", minimum=128),
    _s("QUEEN_ADMIT_HOLD_MS", int, 15000,
       "How long a write request may wait for admission before 429.", minimum=0),
    _s("QUEEN_PUSH_WINDOW_KB", int, 1024,
       "Push and transaction body bytes a front worker works on at once (inside its admission "
       "budget; a QPB1 push or QTB1 transaction counts what its zstd frames decode to); the "
       "others wait unread in their sockets. Bounds a worker's memory under big pushes (64 "
       "connections of 1,000-item JSON: workers 87-107 -> 75-78 MB; of QPB1: 83-96 -> 67-68 MB; "
       "no slower). 2048 -> 1024: peak PSS of the broker under 64 connections of 1,000-item "
       "pushes 131-132 -> 125-129 MB (JSON), 119-123 -> 115-117 MB (QPB1), no slower.",
       minimum=64, maximum=1 << 20),
    _s("QUEEN_RECV_BUFFER_KB", int, 32,
       "Receive buffer of each client connection (SO_RCVBUF; the kernel doubles it for its "
       "bookkeeping, and caps it at net.core.rmem_max); 0 = the kernel's autotuning. A body "
       "that waits for admission or the work window waits in it, unread: the event loop reads "
       "up to 250 KB at once, so with autotuning each waiting 1,000-item JSON push was mostly "
       "read into its front worker (64 connections: peak PSS of the broker 130.3-140.5 -> "
       "120.0-124.6 MB at 32, 16 no lower). It also bounds one connection's upload to about "
       "twice this per network round trip: raise it for distant clients sending big bodies.",
       minimum=0, maximum=65536),
    # --- authentication
    _s("QUEEN_JWT_ENABLED", bool, False,
       "Require a JWT bearer token on the API (all but /health, /metrics*, "
       "/api/v1/openapi.json, OPTIONS)."),
    _s("QUEEN_JWT_SECRET", str, "", "HMAC (HS256/384/512) shared secret.", secret=True),
    _s("QUEEN_JWT_ALGORITHMS", str, "HS256",
       "Accepted token algorithms, comma separated (HS*, RS*, PS*, ES*, EdDSA)."),
    _s("QUEEN_JWT_PUBLIC_KEY_FILE", str, "",
       "PEM public key for RS*/PS*/ES*/EdDSA tokens."),
    _s("QUEEN_JWT_JWKS_FILE", str, "",
       "JWKS file of public keys; a token's kid picks one."),
    _s("QUEEN_JWT_ISSUER", str, "", "Required issuer (iss), if set."),
    _s("QUEEN_JWT_AUDIENCE", str, "",
       "Required audience (aud), if set; comma separated = any one of them."),
    _s("QUEEN_JWT_TENANT_CLAIM", str, "tenant",
       "Claim naming the tenant: UUID text as is, other text -> uuid5; absent = default."),
)

_BY_ATTR = {s.attr: s for s in SETTINGS}


def _config_fields() -> list[tuple[str, type, Any]]:
    return [(s.attr, s.kind, field(default=s.default)) for s in SETTINGS]


_ConfigBase = dataclasses.make_dataclass("_ConfigBase", _config_fields(), frozen=True)


class Config(_ConfigBase):  # type: ignore[misc, valid-type]
    """Resolved settings. Build with ``Config.load``; attributes are the lower-case names."""

    @classmethod
    def load(cls, env: Mapping[str, str] | None = None,
             overrides: Mapping[str, Any] | None = None) -> Config:
        """Defaults < environment < overrides (command line); every value validated."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for s in SETTINGS:
            values[s.attr] = s.parse(env[s.env]) if s.env in env else s.default
        for attr, raw in (overrides or {}).items():
            if raw is None:
                continue
            if attr not in _BY_ATTR:
                raise ConfigError(f"unknown setting {attr!r}")
            values[attr] = _BY_ATTR[attr].parse(raw)
        if values["encryption_key"]:
            key = values["encryption_key"]
            try:
                ok = len(bytes.fromhex(key)) == 32
            except ValueError:
                ok = False
            if not ok:
                raise ConfigError("QUEEN_ENCRYPTION_KEY: must be 64 hex characters (32 bytes)")
            if values["encryption_key_file"]:
                raise ConfigError("QUEEN_ENCRYPTION_KEY and QUEEN_ENCRYPTION_KEY_FILE exclude "
                                  "each other: set one")
        if values["jwt_enabled"] and not (values["jwt_secret"] or values["jwt_public_key_file"]
                                          or values["jwt_jwks_file"]):
            raise ConfigError("QUEEN_JWT_ENABLED=1 needs QUEEN_JWT_SECRET, "
                              "QUEEN_JWT_PUBLIC_KEY_FILE or QUEEN_JWT_JWKS_FILE")
        return cls(**values)

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)

    def to_env(self) -> dict[str, str]:
        """The resolved values as env variables, for child processes."""
        return {s.env: s.render(getattr(self, s.attr)) for s in SETTINGS}

    # --- derived paths
    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).resolve()

    @property
    def spool_path(self) -> Path:
        return Path(self.spool_dir).resolve() if self.spool_dir else self.data_path / "spool"

    @property
    def dedup_spill_path(self) -> Path:
        return self.data_path / "dedup"

    @property
    def embedded_pg_path(self) -> Path:
        return self.data_path / "pg"

    @property
    def instance_name(self) -> str:
        return self.instance_id or f"{os.uname().nodename}:{self.port}"

    def describe(self) -> list[tuple[str, str]]:
        """Boot configuration block, secrets masked."""
        out = []
        for s in SETTINGS:
            value = getattr(self, s.attr)
            shown = ("***" if value else "") if s.secret else s.render(value)
            out.append((s.env, shown))
        return out


def settings_table_markdown() -> str:
    """The README's configuration table, generated so it cannot drift from the code."""
    rows = ["| Variable | Default | Range | Meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        rows.append(f"| `{s.env}` | `{s.default_text}` | {s.range_text or '-'} | {s.help} |")
    return "\n".join(rows) + "\n"
