"""A gate a test sets on a demo server to catch a load in the middle of its read."""

from __future__ import annotations

import threading


class Gate:
    """Holds a demo server's reads (a FeedAPI fetch, a Nakadi stream before it reads a partition) until
    opened. `partition`: hold only the reads of that partition (others pass)."""

    def __init__(self, partition: int | None = None) -> None:
        self.partition = partition
        self.arrived = threading.Event()  # a read is being held
        self.opened = threading.Event()

    def hold(self, partition: int) -> None:
        if self.partition is not None and partition != self.partition:
            return
        self.arrived.set()
        self.opened.wait(120)
