"""CPU seconds of other processes, from /proc (shared by the benchmark scripts)."""
from __future__ import annotations

import os
from pathlib import Path

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int | None) -> float | None:
    """CPU seconds (user + system, waited-for children included) of a live process."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return sum(int(x) for x in fields[11:15]) / CLOCK_TICKS
