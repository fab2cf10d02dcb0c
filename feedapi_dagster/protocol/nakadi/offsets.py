"""Nakadi's offsets (`001-0001-000000000000000042`: version, timeline, offset; or a bare number) and
their order."""

from __future__ import annotations

from ..models import FIRST

BEGIN = "BEGIN"  # Nakadi's offset before the oldest available event


def offset_key(offset: str) -> tuple[int, ...]:
    """An offset as a key in their order (empty for one that does not parse)."""
    parts = offset.split("-")
    return tuple(int(part) for part in parts) if all(part.isdigit() for part in parts) else ()


def same_timeline(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Two offsets whose difference counts events (offsets of two timelines, or unparsed: it does not)."""
    return bool(a) and len(a) == len(b) and a[:-1] == b[:-1]


def reached(offset: str, end: str) -> bool:
    if end == FIRST:
        return False
    at, last = offset_key(offset), offset_key(end)
    return bool(at) and len(at) == len(last) and at >= last
