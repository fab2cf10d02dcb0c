"""The bearer token a demo server may require: read from an environment variable (a console command's
`--token-env`), and found in a request's Authorization header."""

from __future__ import annotations

import hmac
import os


def token_from(env_name: str | None) -> str | None:
    """A console command's `--token-env`: the token the server requires, read from that variable."""
    if not env_name:
        return None
    token = os.environ.get(env_name)
    if not token:
        raise SystemExit(f"environment variable {env_name} is not set")
    return token


def bearer_token(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (the scheme in any case); None when the
    header is missing or holds no bearer token."""
    scheme, _, value = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def is_token(sent: str, token: str) -> bool:
    """Whether the token sent is `token` (compared in constant time)."""
    return hmac.compare_digest(sent.encode(), token.encode())
