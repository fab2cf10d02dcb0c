"""What both demo feeds (FeedAPI's `DemoFeed`, Nakadi's `NakadiEventType`) are made of: a seeded
random source (the same seed, the same events), a share of events published again, a lock, and the
count of writes their streams wait on."""

from __future__ import annotations

import random
import threading


class Changes:
    """The writes of a demo feed, counted under the feed's own lock: a stream notes `count`, reads,
    and when caught up waits (`wait`) until the count moves or its timeout passes."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self._changed = threading.Condition(lock)
        self._count = 0

    @property
    def count(self) -> int:
        with self._lock:
            return self._count

    def bump(self) -> None:
        """One more write (the caller holds the feed's lock); wakes every waiting stream."""
        with self._lock:
            self._count += 1
            self._changed.notify_all()

    def wait(self, seen: int, timeout: float) -> bool:
        """Wait up to `timeout` seconds for a write after `seen` (a `count`); True if there was one."""
        with self._changed:
            return self._changed.wait_for(lambda: self._count != seen, max(0.0, timeout))


class SeededFeed:
    """The base of a demo feed: `_rng` (seeded), `_lock` (reentrant: a write calls other methods that
    take it), `changes`; `_republishes` draws whether an event is published again."""

    def __init__(self, seed: int, duplicate_ratio: float) -> None:
        self._duplicate_ratio = duplicate_ratio
        self._rng = random.Random(seed)
        self._lock = threading.RLock()
        self.changes = Changes(self._lock)  # every write, for the streams that wait for new events

    def _republishes(self) -> bool:
        """Whether the event being published is published again (at-least-once: `duplicate_ratio`);
        draws from `_rng` only when the ratio is not 0, so that a feed without duplicates is the same."""
        return bool(self._duplicate_ratio) and self._rng.random() < self._duplicate_ratio
