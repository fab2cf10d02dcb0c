"""Nakadi's offsets as the demo event type writes them: BEGIN, or `001-0001-` and 18 digits (zero-padded,
so that string order is numeric order)."""

from __future__ import annotations

import re

BEGIN = "BEGIN"
_OFFSET = re.compile(r"001-0001-(\d{18})")


def format_offset(n: int) -> str:
    """Nakadi's wire offset for integer offset `n` (zero-padded: string order is numeric order)."""
    return f"001-0001-{n:018d}"


def parse_offset(offset: str) -> int | None:
    """The integer offset of a wire offset, None for BEGIN (any case); ValueError if malformed."""
    if offset.upper() == BEGIN:
        return None
    match = _OFFSET.fullmatch(offset)
    if match is None:
        raise ValueError(f"malformed offset {offset!r}: expected BEGIN or 001-0001-<18 digits>")
    return int(match.group(1))
