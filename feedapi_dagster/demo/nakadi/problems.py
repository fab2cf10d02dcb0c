"""The demo Nakadi server's errors: the spec's `Problem` (`application/problem+json`)."""

from __future__ import annotations

from http import HTTPStatus


class Problem(Exception):
    """An error answered as an `application/problem+json` Problem."""

    def __init__(self, status: int, detail: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers


def problem(status: int, detail: str) -> dict[str, object]:
    """The spec's `Problem` object."""
    title = HTTPStatus(status).phrase
    return {"type": f"https://httpstatus.es/{status}", "title": title, "status": status, "detail": detail}
