"""The admin endpoint of the demo servers, under /admin/: it drives the served model over HTTP (for
the console demo, the benchmarks and the tests), and sets the faults, the same on every demo server.
Not authenticated, never faulty.

An action takes the request's JSON object (an empty body: {}) and its URL, and returns the JSON
answer; a missing field (KeyError) or a bad value (ValueError, TypeError, LookupError) is a 400.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import SplitResult

from feedapi_dagster.demo.faults import KINDS, Faults

AdminAction = Callable[[dict[str, Any], SplitResult], object]
# (HTTP method, path) -> the action
AdminActions = dict[tuple[str, str], AdminAction]


class WithFaults(Protocol):
    faults: Faults | None


def fault_admin_actions(server: WithFaults) -> AdminActions:
    """POST /admin/faults {rate, seed, retry_after, kinds}: the faults `server` plays from now on."""

    def set_faults(args: dict[str, Any], url: SplitResult) -> object:
        faults = Faults(
            float(args.get("rate", 0.0)),
            int(args.get("seed", 0)),
            int(args.get("retry_after", 1)),
            tuple(args.get("kinds", KINDS)),
        )
        server.faults = faults
        return {
            "rate": faults.rate,
            "seed": faults.seed,
            "retry_after": faults.retry_after,
            "kinds": list(faults.kinds),
        }

    return {("POST", "/admin/faults"): set_faults}


def run_admin_action(actions: AdminActions, method: str, url: SplitResult, body: bytes) -> tuple[int, object]:
    """The status and JSON answer of the admin request `method url` with `body`."""
    try:
        args = json.loads(body) if body.strip() else {}
        if not isinstance(args, dict):
            raise TypeError("the request body must be a JSON object")
        action = actions.get((method, url.path))
        if action is None:
            return 404, {"error": f"no admin action {method} {url.path}"}
        return 200, action(args, url)
    except KeyError as e:
        return 400, {"error": f"missing field {e}"}
    except (ValueError, TypeError, LookupError) as e:
        return 400, {"error": str(e)}
