"""Errors raised by the protocol layer.

Messages name the feed URL (never a bearer token) and, where there is one, the partition.
"""
from __future__ import annotations


class FeedAPIError(Exception):
    """A FeedAPI request failed in a way the caller must see (bad request, auth, retries exhausted)."""

    def __init__(self, message: str, *, status: int | None = None, partition: int | None = None):
        super().__init__(message)
        self.status = status
        self.partition = partition


class RediscoveryNeeded(FeedAPIError):
    """The server answered 409: its discovery token changed, so partitions must be discovered again."""


class MalformedResponse(FeedAPIError):
    """A body that cannot be read as FeedAPI NDJSON (cut short, junk, invalid UTF-8, non-object line).

    Raised mid-stream after every complete checkpoint before the damage has been yielded; the client
    retries from the last good cursor.
    """
