"""Other processes: their CPU seconds and memory from /proc (Linux), waiting for and stopping them."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def proc_cpu(pid: int | None) -> float | None:
    """CPU seconds (user + system, waited-for children included) of a live process."""
    fields = _stat(pid) if pid is not None else None
    return None if fields is None else sum(int(x) for x in fields[11:15]) / CLOCK_TICKS


def status_mb(pid: int, key: str = "VmHWM") -> float | None:
    """A `/proc/<pid>/status` size in MB: VmHWM (peak resident set since the process started) or VmRSS."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return None


def descendants(root: int) -> list[int]:
    """The live processes below `root` (children, their children, ...)."""
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None:
                parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def command(pid: int, words: int = 4) -> str:
    try:
        return " ".join(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:words])
    except OSError:
        return "?"


class MemoryWatch:
    """Samples the resident memory of process trees every `interval` seconds in a thread, so that
    short-lived processes (Spark's Python workers) are seen too. Per tree: the peak (VmHWM) of the root
    and of each descendant running `children` (a command prefix), and the largest sum of those
    descendants' resident sets in one sample (forked workers share pages: the sum counts them per
    process)."""

    def __init__(self, interval: float = 0.2, children: str = "python"):
        self.interval = interval
        # only descendants whose command starts with this: a JVM's vforked helpers (jspawnhelper, before
        # their exec) show the JVM's own memory
        self.children = children
        self.roots: dict[str, int] = {}
        self.root_peak: dict[str, float] = {}
        self.child_peak: dict[str, dict[int, float]] = {}
        self.children_sum: dict[str, float] = {}
        self.kinds: dict[int, str] = {}  # what each descendant runs (its command line, shortened)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="memory-watch", daemon=True)

    def watch(self, name: str, pid: int) -> None:
        with self._lock:
            self.roots[name] = pid
        if not self._thread.is_alive():
            self._thread.start()

    def sample(self) -> None:
        with self._lock:
            roots = dict(self.roots)
        for name, pid in roots.items():
            peak = status_mb(pid)
            if peak is not None:
                self.root_peak[name] = max(peak, self.root_peak.get(name, 0.0))
            total = 0.0
            seen = self.child_peak.setdefault(name, {})
            for child in descendants(pid):
                kind = self.kinds.get(child) or command(child)
                if self.children not in kind.split(" ", 1)[0]:
                    continue
                self.kinds[child] = kind
                peak, now = status_mb(child), status_mb(child, "VmRSS")
                if peak is not None:
                    seen[child] = max(peak, seen.get(child, 0.0))
                total += now or 0.0
            self.children_sum[name] = max(total, self.children_sum.get(name, 0.0))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def wait_with_usage(proc: subprocess.Popen) -> tuple[int, float, float]:
    """Waits for a child: its exit code, max RSS (MB) and CPU seconds (its waited-for children included)."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def tree_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds of a process, and of its live descendants (those that exited count in their parents)."""
    return proc_cpu(pid) or 0.0, sum(proc_cpu(p) or 0.0 for p in descendants(pid))


def stop_process(proc: subprocess.Popen | None) -> None:
    """SIGTERM, then SIGKILL after 20 s."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def release_spark_port(port: int) -> list[int]:
    """Stops the Spark Connect servers left on `port` (`stop_strays`) and removes the port's start lock
    file that `ensure_embedded_server` leaves in the temp folder; the pids stopped."""
    strays = stop_strays(port)
    Path(tempfile.gettempdir(), f"feedapi-dagster-spark-{port}.lock").unlink(missing_ok=True)
    return strays


def stop_strays(port: int) -> list[int]:
    """Stops the process groups of Spark Connect servers bound to `port` (e.g. one that a Dagster run
    started because the benchmark's own had died); their pids."""
    marker = f"spark.connect.grpc.binding.port={port}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in (entry / "cmdline").read_bytes().split(b"\0"):
                found.append(int(entry.name))
                os.killpg(os.getpgid(int(entry.name)), signal.SIGTERM)
        except (OSError, ProcessLookupError):
            pass
    return found


def find_free_port(host: str = "127.0.0.1") -> int:
    """An ephemeral port that is free right now on ``host`` (the benchmarks run as scripts: `tests` is
    not importable from them)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
