"""What an embedded Spark Connect server leaves in the temp folder, and how to tell it is still the
server: `<tmp>/feedapi-dagster-spark-<port>.json` (mode 0600, written when it starts, removed when it
stops) records its pid, the start time of that pid, the installation that started it (the Python
environment, `sys.prefix`), its log and work dir.

A pid alone does not identify a server: a server that died leaves its record behind, and the kernel
gives its pid to the next process. `is_recorded_server` compares the process's start time (Linux's
``/proc/<pid>/stat``) and its command line with the record's, so `feedapi-dagster spark stop` never
signals an unrelated process, and it refuses a server another installation started (that one's
Python workers run that installation's code).

A server's processes are one process group (its JVM and its Python workers). `stop_process_group`
is how a group is stopped: a server's (`embedded`, `connect_server`) and `feedapi-dagster dev`'s
`dagster dev` with its children.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from feedapi_dagster.spark.settings import CONNECT_SERVER_CLASS, this_installation

_PROC = Path("/proc")


_RECORD_PREFIX = "feedapi-dagster-spark-"


def _temp() -> Path:
    return Path(tempfile.gettempdir())


def record_file(port: int) -> Path:
    return _temp() / f"{_RECORD_PREFIX}{port}.json"


@dataclass(frozen=True)
class ServerRecord:
    port: int
    pid: int
    # clock ticks after boot when `pid` started (/proc/<pid>/stat, field 22): a recycled pid has another
    pid_started: int
    started_at: str  # ISO 8601, UTC
    installation: str
    log_path: str
    work_dir: str
    # stopped when the process that started it exits (`owner_pid`), or left running for later runs
    detached: bool
    owner_pid: int

    @property
    def files(self) -> list[Path]:
        """What the server keeps in the temp folder beside its work dir (token, start-up lock, record)."""
        return list(_server_files(self.port))


def _server_files(port: int) -> tuple[Path, Path, Path]:
    """The token, start-up lock and record of the server on `port`."""
    base = record_file(port)
    return base.with_suffix(".token"), base.with_suffix(".lock"), base


def process_started(pid: int) -> int | None:
    """When `pid` started (clock ticks after boot), or None when there is no such process (or no /proc)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # the command name in parentheses may hold spaces: fields are counted after its closing ')'
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[19])


def _command_line(pid: int) -> list[str]:
    try:
        return (_PROC / str(pid) / "cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def write_record(port: int, pid: int, *, log_path: Path, work_dir: Path, detached: bool) -> ServerRecord:
    record = ServerRecord(
        port=port,
        pid=pid,
        pid_started=process_started(pid) or 0,
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
        installation=this_installation(),
        log_path=str(log_path),
        work_dir=str(work_dir),
        detached=detached,
        owner_pid=os.getpid(),
    )
    path = record_file(port)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(asdict(record), handle, indent=2)
    return record


def read_record(port: int) -> ServerRecord | None:
    """The record of the server on `port`; None when there is none, or it is not this user's own
    (a file someone else could have written is no evidence of which process to signal)."""
    path = record_file(port)
    try:
        info = path.stat()
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            return None
        return ServerRecord(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def installation_records() -> list[ServerRecord]:
    """The records of the embedded servers this installation started, whatever their port (its own
    by default, or a project's `spark.port`): what `feedapi-dagster spark status|stop` act on."""
    names = (path.stem.removeprefix(_RECORD_PREFIX) for path in _temp().glob(f"{_RECORD_PREFIX}*.json"))
    records = (read_record(int(name)) for name in names if name.isdigit())
    return sorted(
        (record for record in records if record is not None and record.installation == this_installation()),
        key=lambda record: record.port,
    )


def remove_server_files(port: int, *, lock: bool) -> None:
    """Remove the token and record of the server on `port`, and with `lock` its start-up lock (only
    while holding it: `embedded._port_lock`)."""
    token, lock_file, record = _server_files(port)
    for path in (token, lock_file, record) if lock else (token, record):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def is_recorded_server(record: ServerRecord) -> bool:
    """Whether the record's pid is still its server: started when recorded, a Spark Connect server on
    the record's port."""
    if process_started(record.pid) != record.pid_started:
        return False
    command = _command_line(record.pid)
    return CONNECT_SERVER_CLASS in command and f"spark.connect.grpc.binding.port={record.port}" in command


def process_group(pgid: int) -> list[int]:
    """The live processes of a process group: a server's JVM and its Python workers."""
    members = []
    for stat in _PROC.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and (fields[0] not in _DEAD or _threads_live(stat.parent)):
            members.append(int(stat.parent.name))
    return members


_DEAD = ("Z", "X")


def _threads_live(process: Path) -> bool:
    """Whether threads of a process whose main thread is a zombie still run: a killed JVM's main thread
    exits first, the others hold its files (its listening socket) until the last of them is gone."""
    for stat in process.glob("task/[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            if stat.read_text().rsplit(")", 1)[1].split()[0] not in _DEAD:
                return True
    return False


def stop_process_group(
    pgid: int, grace_seconds: float, *, kill_seconds: float = 10.0, on_kill: Callable[[], None] | None = None
) -> bool:
    """SIGTERM the process group `pgid`, SIGKILL what is left of it after `grace_seconds` (`on_kill`
    called first); whether none of its processes is left, at most `kill_seconds` after that. A leader
    that is the caller's child counts as gone once it exited (a zombie until the caller waits for it)."""
    _signal_group(pgid, signal.SIGTERM)
    if _gone_within(pgid, grace_seconds):
        return True
    if on_kill is not None:
        on_kill()
    _signal_group(pgid, signal.SIGKILL)
    return _gone_within(pgid, kill_seconds)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _gone_within(pgid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while process_group(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def resident_bytes(pids: list[int]) -> int:
    """The memory the processes hold in RAM (their VmRSS)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            for line in (_PROC / str(pid) / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total
