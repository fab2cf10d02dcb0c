"""Nakadi event types through Nakadi's low-level API: the protocol, its settings, its offsets and the
reader of its event stream."""

from .protocol import Nakadi
from .settings import NakadiSettings

__all__ = ["Nakadi", "NakadiSettings"]
