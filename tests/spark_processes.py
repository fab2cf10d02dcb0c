"""Finding Spark's processes in /proc, for tests that kill them."""

from __future__ import annotations

import os
from pathlib import Path


def _processes() -> dict[int, tuple[bytes, int]]:
    """pid -> (command line, parent pid)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        found[int(entry.name)] = (command, parent)
    return found


def python_workers(root: int) -> list[int]:
    """The Python workers under process `root` (a Spark JVM, or a process that started one): forks of
    `pyspark.daemon`, not the daemon itself."""
    processes = _processes()
    below = {root}
    grew = True
    while grew:  # descendants of root
        grew = False
        for pid, (_, parent) in processes.items():
            if parent in below and pid not in below:
                below.add(pid)
                grew = True
    daemons = {
        pid
        for pid in below
        if b"pyspark.daemon" in processes[pid][0]
        and b"pyspark.daemon" not in processes.get(processes[pid][1], (b"", 0))[0]
    }
    return sorted(pid for pid in below if processes[pid][1] in daemons)


def connect_server_pid(port: int) -> int | None:
    """The JVM of the Spark Connect server listening on `port`."""
    needle = f"spark.connect.grpc.binding.port={port} ".encode()
    return next(
        (pid for pid, (command, _) in _processes().items() if needle in command + b" " and b"java" in command), None
    )


def kill(pids: list[int], sig: int) -> list[int]:
    killed = []
    for pid in pids:
        try:
            os.kill(pid, sig)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed
