"""What every protocol's discovery does with its answer: a refused or non-JSON answer is an error,
and each partition entry is parsed on its own, a bad one rejected with a message (logged, and kept in
`FeedInfo.rejected`) while the others are read."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import ValidationError

from feedapi_dagster.errors import ProtocolError

from .interface import FeedProtocol, Response
from .models import Partition
from .settings import FeedSettings

log = logging.getLogger(__name__)


def document(protocol: FeedProtocol, feed: FeedSettings, response: Response, what: str) -> Any:
    """The JSON of a discovery answer (`what` names it in errors)."""
    if response.status != 200:
        raise protocol.refusal(feed, response, None, what)
    try:
        return response.json()
    except ValueError as error:
        raise ProtocolError(f"feed {feed.safe_url}: the {what} response is not JSON") from error


def partitions(
    feed: FeedSettings, entries: Iterable[Any], parse: Callable[[Any], Partition]
) -> tuple[list[Partition], list[str]]:
    """The entries `parse` accepts, and a message for each one it rejects (ValueError, TypeError,
    KeyError: a missing field)."""
    accepted: list[Partition] = []
    rejected: list[str] = []
    for entry in entries:
        try:
            accepted.append(parse(entry))
        except ValidationError as error:
            reasons = "; ".join(e["msg"].removeprefix("Value error, ") for e in error.errors())
            rejected.append(f"partition entry {str(entry)[:120]} rejected: {reasons}")
        except (ValueError, TypeError, KeyError) as error:
            rejected.append(f"partition entry {str(entry)[:120]} rejected: {error!s}")
    for message in rejected:
        log.error("feed %s: %s", feed.safe_url, message)
    return accepted, rejected
