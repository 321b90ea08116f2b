"""An embedded PostgreSQL cluster for `queen-mp serve` without a DSN, and for tests.

The cluster is an ordinary one driven by the distribution's `initdb` and `pg_ctl`, so an
operator can inspect it with the usual tools. Settings live in `queen-mp.conf` inside the
cluster, rewritten at every start and included from `postgresql.conf`; `ALTER SYSTEM` still
overrides them.

PostgreSQL refuses to run as root. When we are root, every server command runs as an
unprivileged system user (`postgres` if present, else `queen-mp`, created on demand); the
cluster and socket directories belong to that user, and every directory above them must be
searchable by it. Unix socket paths are limited to 107 bytes, so the socket directory moves to
/tmp when the one beside the cluster would be too long.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from queen_mp.db.errors import EmbeddedPostgresError

__all__ = ["EmbeddedPostgres", "PgBinaries", "find_pg_binaries"]

_log = logging.getLogger(__name__)

CONF_FILE = "queen-mp.conf"
PORT_FILE = "queen-mp.port"
STARTUP_LOG = "startup.log"
DEFAULT_ACCOUNT = "queen-mp"
_INCLUDE_LINE = f"include = '{CONF_FILE}'  # queen-mp settings, rewritten at every start"
_SOCKET_NAME_MAX = len(".s.PGSQL.65535")
_SUN_PATH_MAX = 107  # sizeof(sockaddr_un.sun_path) - 1 on Linux
_SEARCH_DIRS = ("/usr/lib/postgresql/*/bin", "/usr/pgsql-*/bin", "/usr/local/pgsql/bin")
_INSTALL_HINT = (
    "install the PostgreSQL server (Debian/Ubuntu: apt-get install postgresql; "
    "Fedora/RHEL: dnf install postgresql-server), or give a DSN instead of an embedded cluster"
)


@dataclass(frozen=True, slots=True)
class PgBinaries:
    """One PostgreSQL installation's server programs, all from the same directory."""

    bin_dir: Path
    major: int

    @property
    def initdb(self) -> Path:
        return self.bin_dir / "initdb"

    @property
    def pg_ctl(self) -> Path:
        return self.bin_dir / "pg_ctl"

    @property
    def postgres(self) -> Path:
        return self.bin_dir / "postgres"


@dataclass(frozen=True, slots=True)
class _Account:
    """The unprivileged user the server runs as when we are root."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]


def _candidate_dirs(search_path: str | None, patterns: tuple[str, ...]) -> list[Path]:
    dirs: list[Path] = []
    on_path = shutil.which("pg_ctl", path=search_path)
    if on_path:
        dirs.append(Path(os.path.realpath(on_path)).parent)

    def version_key(path: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", path))

    for pattern in patterns:
        for found in sorted(glob.glob(pattern), key=version_key, reverse=True):
            resolved = Path(os.path.realpath(found))
            if resolved not in dirs:
                dirs.append(resolved)
    return dirs


def _major_version(postgres: Path) -> int | None:
    try:
        out = subprocess.run(
            [str(postgres), "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"\(PostgreSQL\)\s+(\d+)", out)
    return int(match.group(1)) if match else None


def find_pg_binaries(
    bin_dir: Path | None = None,
    *,
    major: int | None = None,
    search_path: str | None = None,
    patterns: tuple[str, ...] = _SEARCH_DIRS,
) -> PgBinaries:
    """Locate initdb, pg_ctl and postgres: `bin_dir`, else PATH, else the newest packaged one.

    `major` asks for a specific major version (an existing cluster's PG_VERSION), since a
    server cannot open a cluster made by another major version.
    """
    dirs = [bin_dir] if bin_dir is not None else _candidate_dirs(search_path, patterns)
    complete = [
        d for d in dirs
        if all(os.access(d / name, os.X_OK) for name in ("initdb", "pg_ctl", "postgres"))
    ]
    found: list[PgBinaries] = []
    for d in complete:
        version = _major_version(d / "postgres")
        if version is None:
            continue
        if major is None or version == major:
            return PgBinaries(d, version)
        found.append(PgBinaries(d, version))
    if found:
        have = ", ".join(f"{b.major} ({b.bin_dir})" for b in found)
        raise EmbeddedPostgresError(
            f"the cluster needs PostgreSQL {major} server binaries but only {have} found: "
            f"install PostgreSQL {major} (Debian: apt-get install postgresql-{major}) "
            "or upgrade the cluster with pg_upgrade"
        )
    where = str(bin_dir) if bin_dir is not None else "PATH, " + ", ".join(patterns)
    raise EmbeddedPostgresError(
        f"PostgreSQL server programs (initdb, pg_ctl, postgres) not found in {where}: "
        + _INSTALL_HINT
    )


def _nologin_shell() -> str:
    for shell in ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false"):
        if os.path.exists(shell):
            return shell
    return "/bin/false"


def _lookup_account(name: str) -> _Account | None:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    groups = tuple(os.getgrouplist(name, entry.pw_gid))
    return _Account(name, entry.pw_uid, entry.pw_gid, groups)


def _create_system_user(name: str, log: logging.Logger) -> _Account:
    shell = _nologin_shell()
    if shutil.which("useradd"):
        cmd = ["useradd", "--system", "--user-group", "--no-create-home", "--shell", shell, name]
    elif shutil.which("adduser"):  # busybox (Alpine)
        cmd = ["adduser", "-S", "-D", "-H", "-s", shell, name]
    else:
        raise EmbeddedPostgresError(
            f"PostgreSQL cannot run as root and there is neither a 'postgres' user nor "
            f"useradd/adduser to create '{name}': create an unprivileged user and pass it "
            "as run_as"
        )
    log.info("creating system user %s to run the embedded PostgreSQL", name)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    account = _lookup_account(name)  # NOTE(db): a concurrent starter may have won the race
    if account is None:
        raise EmbeddedPostgresError(
            f"could not create system user {name} ({' '.join(cmd)}: exit {result.returncode}: "
            f"{result.stderr.strip()})"
        )
    return account


def _searchable_by(st: os.stat_result, account: _Account) -> bool:
    if st.st_uid == account.uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid in account.groups:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def _check_traversable(path: Path, account: _Account) -> None:
    """Fail early and by name when the server user cannot reach `path` (e.g. under /root)."""
    for ancestor in reversed(path.parents):
        try:
            st = ancestor.stat()
        except FileNotFoundError:
            return  # the rest will be created searchable
        if not _searchable_by(st, account):
            raise EmbeddedPostgresError(
                f"{ancestor} is not searchable by user {account.name}, which runs the "
                f"embedded PostgreSQL (PostgreSQL refuses to run as root), so it cannot reach "
                f"{path}: choose a data directory elsewhere (e.g. under /var/lib) or grant "
                f"search permission (chmod o+x {ancestor})"
            )


def socket_dir_for(data_dir: Path) -> Path:
    """Beside the cluster if the socket path fits in sun_path, else a stable dir in /tmp."""
    beside = data_dir.parent / f"{data_dir.name}-socket"
    if len(os.fsencode(beside)) + 1 + _SOCKET_NAME_MAX <= _SUN_PATH_MAX:
        return beside
    # PERF(db): imported here: hashlib loads OpenSSL's libcrypto, 3.5 MB of RSS the supervisor
    # does not otherwise need.
    import hashlib

    digest = hashlib.sha256(os.fsencode(data_dir)).hexdigest()[:16]
    return Path("/tmp") / f"queen-mp-{digest}"


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _pick_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _conf_quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def _conninfo(**params: str) -> str:
    """A libpq ``key=value`` connection string, quoted as psycopg's ``make_conninfo`` does.

    Not psycopg's own: the supervisor builds this DSN and must not load psycopg (21 MB of RSS).
    libpq's rule: backslash and single quote are escaped with a backslash; a value that is empty
    or contains whitespace is single-quoted.
    """
    parts = []
    for key, value in params.items():
        escaped = re.sub(r"([\\'])", r"\\\1", value)
        if not escaped or re.search(r"\s", escaped):
            escaped = f"'{escaped}'"
        parts.append(f"{key}={escaped}")
    return " ".join(parts)


class EmbeddedPostgres:
    """A PostgreSQL cluster in `data_dir`, owned and started by this broker.

    `start()` is idempotent: it initialises the cluster on first use, adopts a server that is
    already running on the directory, and otherwise starts one (PostgreSQL itself recovers
    from a crash and replaces a stale postmaster.pid). `port=0` picks a free port once and
    remembers it in the cluster so the DSN survives restarts.
    """

    def __init__(
        self,
        data_dir: Path,
        port: int = 0,
        log: logging.Logger | None = None,
        *,
        fsync: bool = True,
        run_as: str | None = None,
        bin_dir: Path | None = None,
        superuser: str = "queen",
        timeout: float = 60.0,
    ) -> None:
        self.data_dir = Path(os.path.abspath(data_dir))
        self.port = port  # the actual port once started
        self._requested_port = port
        self.log = log or _log
        self.fsync = fsync
        self.superuser = superuser
        self.timeout = timeout
        self._run_as = run_as
        self._bin_dir = bin_dir
        self._binaries: PgBinaries | None = None
        self._account: _Account | None = None
        self._account_resolved = False
        self._dsn: str | None = None

    # -- public verbs -------------------------------------------------------------------------

    def start(self) -> str:
        """Start (or adopt) the server and return a libpq DSN over its unix socket."""
        account = self._resolve_account()
        if account is not None:
            _check_traversable(self.data_dir, account)
        self._make_parents(self.data_dir.parent, account)
        binaries = self._find_binaries()
        if not (self.data_dir / "PG_VERSION").exists():
            self._initdb(binaries, account)
        self._ensure_include()
        running = self._wait_settled()
        if running is not None:
            port, socket_dir = running
            self.log.info("adopting PostgreSQL already running on %s", self.data_dir)
        else:
            port, socket_dir = self._start_server(binaries, account)
        self.port = port
        self._dsn = _conninfo(
            host=str(socket_dir), port=str(port), user=self.superuser, dbname="postgres"
        )
        return self._dsn

    def stop(self, mode: str = "fast") -> None:
        """Stop the server and wait for it; escalate to `immediate` if `mode` times out."""
        if mode not in ("smart", "fast", "immediate"):
            raise ValueError(f"unknown shutdown mode {mode!r}")
        if self.postmaster_pid() is None:
            return
        binaries = self._find_binaries()
        for attempt in (mode, "immediate"):
            result = self._run(
                [
                    str(binaries.pg_ctl), "stop", "-D", str(self.data_dir), "-m", attempt,
                    "-w", "-t", str(int(self.timeout)), "-s",
                ],
                timeout=self.timeout + 10,
            )
            if self.postmaster_pid() is None:
                return
            self.log.warning(
                "pg_ctl stop -m %s on %s did not stop the server (exit %s): %s",
                attempt, self.data_dir, result.returncode, result.stderr.strip(),
            )
        raise EmbeddedPostgresError(f"could not stop PostgreSQL on {self.data_dir}")

    def is_running(self) -> bool:
        """True while a postmaster holds this cluster."""
        return self.postmaster_pid() is not None

    def postmaster_pid(self) -> int | None:
        """The live postmaster's PID, or None; a PID reused by another program counts as none."""
        info = self._pid_file()
        if info is None:
            return None
        try:
            pid = int(info[0])
        except (ValueError, IndexError):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, owned by the server user
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
        except OSError:
            return pid
        if os.path.basename(argv0) not in (b"postgres", b"postmaster"):
            return None  # NOTE(db): stale pid file whose PID now belongs to something else
        return pid

    @property
    def dsn(self) -> str:
        if self._dsn is None:
            raise EmbeddedPostgresError("the embedded PostgreSQL has not been started")
        return self._dsn

    @property
    def log_dir(self) -> Path:
        """Where the server's own log files go (rotated daily, kept a week)."""
        return self.data_dir / "log"

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EmbeddedPostgres({str(self.data_dir)!r}, port={self.port})"

    # -- set-up ------------------------------------------------------------------------------

    def _resolve_account(self) -> _Account | None:
        if self._account_resolved:
            return self._account
        if os.geteuid() != 0:
            if self._run_as is not None and self._run_as != pwd.getpwuid(os.geteuid()).pw_name:
                raise EmbeddedPostgresError(
                    f"run_as={self._run_as!r} needs root; we run as uid {os.geteuid()}"
                )
            account = None
        elif self._run_as is not None:
            account = _lookup_account(self._run_as) or _create_system_user(
                self._run_as, self.log
            )
        elif (owner := self._cluster_owner()) is not None:
            account = owner  # NOTE(db): an existing cluster runs as whoever made it
        else:
            account = _lookup_account("postgres") or _lookup_account(DEFAULT_ACCOUNT)
            if account is None:
                account = _create_system_user(DEFAULT_ACCOUNT, self.log)
        if account is not None and account.uid == 0:
            raise EmbeddedPostgresError(f"user {account.name} is root; PostgreSQL refuses it")
        self._account, self._account_resolved = account, True
        return account

    def _cluster_owner(self) -> _Account | None:
        try:
            uid = (self.data_dir / "PG_VERSION").stat().st_uid
        except OSError:
            return None
        if uid == 0:
            return None
        try:
            return _lookup_account(pwd.getpwuid(uid).pw_name)
        except KeyError:
            return None

    def _find_binaries(self) -> PgBinaries:
        if self._binaries is None:
            major = None
            version_file = self.data_dir / "PG_VERSION"
            if version_file.exists():
                major = int(version_file.read_text().strip().split(".")[0])
            self._binaries = find_pg_binaries(self._bin_dir, major=major)
        return self._binaries

    def _make_parents(self, path: Path, account: _Account | None) -> None:
        """Create missing directories as searchable (0755) whatever our umask."""
        missing = [p for p in [path, *path.parents] if not p.exists()]
        for directory in reversed(missing):
            with contextlib.suppress(FileExistsError):
                directory.mkdir()
                if account is not None:
                    directory.chmod(0o755)

    def _own(self, path: Path, account: _Account | None, mode: int) -> None:
        if account is not None:
            os.chown(path, account.uid, account.gid)
        path.chmod(mode)

    def _initdb(self, binaries: PgBinaries, account: _Account | None) -> None:
        # NOTE(db): initdb into a sibling and rename, so a kill mid-initdb never leaves a
        # half-made cluster in data_dir; an existing empty dir (a mount point) is used in place.
        if self.data_dir.exists():
            if any(self.data_dir.iterdir()):
                raise EmbeddedPostgresError(
                    f"{self.data_dir} is neither empty nor a PostgreSQL cluster (no PG_VERSION)"
                )
            target = self.data_dir
        else:
            target = self.data_dir.parent / f".{self.data_dir.name}.initdb"
            if target.exists():
                shutil.rmtree(target)
            target.mkdir(mode=0o700)
        self._own(target, account, 0o700)
        cmd = [
            str(binaries.initdb), "-D", str(target), "-U", self.superuser, "--auth=trust",
            "--encoding=UTF8", "--no-locale", "--data-checksums", "--no-instructions",
        ]
        if not self.fsync:
            cmd.append("--no-sync")
        self.log.info("initialising PostgreSQL %s cluster in %s", binaries.major, self.data_dir)
        result = self._run(cmd, timeout=300)
        if result.returncode != 0:
            raise EmbeddedPostgresError(
                f"initdb failed for {self.data_dir} (exit {result.returncode}): "
                f"{(result.stderr or result.stdout).strip()}"
            )
        if target != self.data_dir:
            target.rename(self.data_dir)

    def _ensure_include(self) -> None:
        conf = self.data_dir / "postgresql.conf"
        text = conf.read_text()
        if _INCLUDE_LINE not in text.splitlines():
            with conf.open("a") as f:
                f.write(("" if text.endswith("\n") else "\n") + _INCLUDE_LINE + "\n")

    def _choose_port(self) -> int:
        port_file = self.data_dir / PORT_FILE
        if self._requested_port:
            port = self._requested_port
        else:
            port = 0
            with contextlib.suppress(OSError, ValueError):
                port = int(port_file.read_text().strip())
            if port and not _port_is_free(port):
                self.log.warning("remembered port %s is taken; picking another", port)
                port = 0
            if not port:
                port = _pick_free_port()
        port_file.write_text(f"{port}\n")
        return port

    def _prepare_socket_dir(self, account: _Account | None) -> Path:
        socket_dir = socket_dir_for(self.data_dir)
        with contextlib.suppress(FileExistsError):
            socket_dir.mkdir(mode=0o700)
        st = socket_dir.lstat()
        if not stat.S_ISDIR(st.st_mode):
            raise EmbeddedPostgresError(f"socket directory {socket_dir} is not a directory")
        if account is None and st.st_uid != os.geteuid():
            raise EmbeddedPostgresError(f"socket directory {socket_dir} belongs to someone else")
        self._own(socket_dir, account, 0o700)
        return socket_dir

    def _write_conf(self, port: int, socket_dir: Path, account: _Account | None) -> None:
        settings = {
            "listen_addresses": _conf_quote("127.0.0.1"),
            "port": str(port),
            "unix_socket_directories": _conf_quote(str(socket_dir)),
            "synchronous_commit": "on",  # invariant 1: 201 means committed and durable
            "fsync": "on" if self.fsync else "off",
            "max_connections": "200",
            "shared_buffers": "128MB",
            "logging_collector": "on",
            "log_directory": _conf_quote("log"),
            "log_filename": _conf_quote("postgresql-%a.log"),
            "log_rotation_age": "1d",
            "log_rotation_size": "0",
            "log_truncate_on_rotation": "on",
        }
        lines = [
            "# Written by queen-mp at every start: edits here are lost.",
            "# Use ALTER SYSTEM (postgresql.auto.conf) to override.",
            *(f"{name} = {value}" for name, value in settings.items()),
        ]
        conf = self.data_dir / CONF_FILE
        conf.write_text("\n".join(lines) + "\n")
        for path in (conf, self.data_dir / PORT_FILE):
            self._own(path, account, 0o600)

    # -- running -----------------------------------------------------------------------------

    def _start_server(self, binaries: PgBinaries, account: _Account | None) -> tuple[int, Path]:
        socket_dir = self._prepare_socket_dir(account)
        if account is not None:
            _check_traversable(socket_dir, account)
        # NOTE(db): no live postmaster (checked by the caller), so these lock files are stale.
        # postgres itself replaces one whose PID is gone, but not one whose PID was reused by
        # another program or is an unreaped zombie (containers whose PID 1 reaps lazily). The
        # socket directory is this cluster's alone, so its locks can only be ours.
        stale = [self.data_dir / "postmaster.pid", *socket_dir.glob(".s.PGSQL.*")]
        for path in stale:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        for attempt in (1, 2):
            port = self._choose_port()
            self._write_conf(port, socket_dir, account)
            startup_log = self.data_dir / STARTUP_LOG
            self.log.info("starting PostgreSQL on %s port %s", self.data_dir, port)
            result = self._run(
                [
                    str(binaries.pg_ctl), "start", "-D", str(self.data_dir), "-l",
                    str(startup_log), "-w", "-t", str(int(self.timeout)), "-s",
                ],
                timeout=self.timeout + 10,
            )
            if result.returncode == 0:
                return port, socket_dir
            # NOTE(db): a port we picked may be grabbed between the probe and the bind.
            if attempt == 1 and not self._requested_port and not _port_is_free(port):
                with contextlib.suppress(OSError):
                    (self.data_dir / PORT_FILE).unlink()
                continue
            break
        raise EmbeddedPostgresError(
            f"PostgreSQL failed to start on {self.data_dir} (pg_ctl exit {result.returncode}): "
            f"{result.stderr.strip()}\n{self._log_tails()}"
        )

    def _wait_settled(self) -> tuple[int, Path] | None:
        """(port, socket dir) of a server that is up on this cluster, or None if there is none.

        A server still starting is waited for; one shutting down is waited out.
        """
        deadline = time.monotonic() + self.timeout
        while True:
            if self.postmaster_pid() is None:
                return None
            info = self._pid_file() or []
            status = info[7].strip() if len(info) > 7 else ""
            if status == "ready" and info[3].strip() and info[4].strip():
                return int(info[3]), Path(info[4].strip())
            if time.monotonic() > deadline:
                raise EmbeddedPostgresError(
                    f"PostgreSQL on {self.data_dir} stayed in state {status!r} for "
                    f"{self.timeout:.0f}s"
                )
            time.sleep(0.05)

    def _pid_file(self) -> list[str] | None:
        try:
            return (self.data_dir / "postmaster.pid").read_text().splitlines()
        except (FileNotFoundError, NotADirectoryError):
            return None
        except PermissionError as ex:
            raise EmbeddedPostgresError(f"cannot read {self.data_dir}: {ex}") from ex

    def _run(self, cmd: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run a server program, as the server user when we are root, with PG* env removed."""
        account = self._resolve_account()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        kwargs: dict[str, object] = {}
        if account is not None:
            kwargs = {"user": account.uid, "group": account.gid, "extra_groups": account.groups}
        try:
            return subprocess.run(
                cmd, capture_output=True, text=True, env=env, cwd="/", timeout=timeout,
                check=False, **kwargs,  # type: ignore[arg-type]
            )
        except subprocess.TimeoutExpired as ex:
            raise EmbeddedPostgresError(f"{cmd[0]} {cmd[1]} timed out after {timeout}s") from ex
        except OSError as ex:
            raise EmbeddedPostgresError(f"could not run {cmd[0]}: {ex}") from ex

    def _log_tails(self) -> str:
        """The end of pg_ctl's log and of the server's newest log, where startup errors land."""
        logs = [self.data_dir / STARTUP_LOG]
        with contextlib.suppress(OSError):
            server_logs = sorted(self.log_dir.iterdir(), key=lambda p: p.stat().st_mtime)
            logs += server_logs[-1:]
        parts = []
        for path in logs:
            try:
                tail = path.read_text(errors="replace").splitlines()[-15:]
            except OSError as ex:
                tail = [f"(unreadable: {ex})"]
            parts.append(f"--- {path} (tail) ---\n" + "\n".join(tail))
        return "\n".join(parts)
