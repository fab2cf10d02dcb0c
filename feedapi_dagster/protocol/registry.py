"""The protocols a feed can speak, open to others (as dlt's `register_paginator`).

A protocol module registers its `FeedProtocol` when it is imported (the built-ins: `protocol/__init__.py`);
the configuration then accepts `protocol: <its name>` with its settings model's fields. This module
imports no protocol. Spark's Python workers parse the `feedapi` data source's options in processes
where a user's protocol module may not have been imported: the options carry its module
(`protocol_module`), which `import_protocol` imports there (a Spark Connect session is sent the
module's package with each load, so that it can: `spark/artifacts.py`).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from feedapi_dagster.errors import ProtocolError

from .interface import FeedProtocol
from .settings import FeedSettings

DEFAULT_PROTOCOL = "feedapi"
_BUILT_IN = "feedapi_dagster."

_PROTOCOLS: dict[str, FeedProtocol] = {}


def register_protocol(protocol: FeedProtocol) -> None:
    """Make `protocol` one a feed can name. Registering a protocol of the same class again (its module
    imported twice) replaces it; another class under a registered name is an error."""
    settings = getattr(protocol, "settings", None)
    named = (
        settings.model_fields.get("protocol")
        if isinstance(settings, type) and issubclass(settings, FeedSettings)
        else None
    )
    if named is None or named.default != protocol.name:
        raise ProtocolError(
            f"protocol {protocol.name!r}: its settings model must extend FeedSettings with "
            f"`protocol: Literal[{protocol.name!r}] = {protocol.name!r}`"
        )
    if wrong := _methods_not_taking_the_interfaces_parameters(protocol):
        raise ProtocolError(f"protocol {protocol.name!r}: " + "; ".join(wrong))
    known = _PROTOCOLS.get(protocol.name)
    if known is not None and _origin(known) != _origin(protocol):
        raise ProtocolError(f"protocol {protocol.name!r} is already registered by {_origin(known)}")
    _PROTOCOLS[protocol.name] = protocol


def _methods_not_taking_the_interfaces_parameters(protocol: FeedProtocol) -> list[str]:
    """Each method of `protocol` that overrides `FeedProtocol`'s and cannot be called as the loads call it."""
    wrong = []
    for name, expected in vars(FeedProtocol).items():
        own = getattr(type(protocol), name, expected)
        if name.startswith("_") or not inspect.isfunction(expected) or own is expected:
            continue
        parameters = list(inspect.signature(expected).parameters)
        try:
            inspect.signature(own).bind(*parameters)
        except TypeError:
            wrong.append(
                f"{type(protocol).__name__}.{name}({', '.join(inspect.signature(own).parameters)}) does not take "
                f"the interface's parameters: {name}({', '.join(parameters)})"
            )
    return wrong


def registered_protocols() -> Mapping[str, FeedProtocol]:
    return dict(_PROTOCOLS)


def protocol_named(name: str) -> FeedProtocol:
    protocol = _PROTOCOLS.get(name)
    if protocol is None:
        raise ProtocolError(unknown_protocol(name))
    return protocol


def protocol_of(feed: FeedSettings) -> FeedProtocol:
    return protocol_named(feed.protocol)


def unknown_protocol(name: object) -> str:
    return f"unknown protocol {name!r}: the registered ones are {', '.join(sorted(_PROTOCOLS))}"


def feed_settings(values: Mapping[str, Any] | None = None, /, **fields: Any) -> FeedSettings:
    """The feed's values validated by the settings model of the protocol they name (`protocol`,
    FeedAPI when absent): the feed's settings are a union discriminated by `protocol`, open to the
    registered protocols. Raises pydantic's ValidationError, for an unknown protocol too."""
    values = {**(values or {}), **fields}
    name = values.get("protocol", DEFAULT_PROTOCOL)
    protocol = _PROTOCOLS.get(name) if isinstance(name, str) else None
    if protocol is None:
        raise ValidationError.from_exception_data(
            "FeedSettings",
            [
                InitErrorDetails(
                    type=PydanticCustomError("unknown_protocol", unknown_protocol(name)), loc=("protocol",), input=name
                )
            ],
        )
    return protocol.settings.model_validate(values)


def protocol_module(name: str) -> str | None:
    """The module that registers the protocol `name`, for a process that may not have imported it;
    None for a built-in one (always registered)."""
    module = type(protocol_named(name)).__module__
    return None if module.startswith(_BUILT_IN) else module


def import_protocol(module: str) -> None:
    """Import the module of a user's protocol, which registers it."""
    try:
        importlib.import_module(module)
    except ImportError as error:
        raise ProtocolError(f"the protocol module {module!r} cannot be imported here: {error}") from error


def _origin(protocol: FeedProtocol) -> str:
    return f"{type(protocol).__module__}.{type(protocol).__qualname__}"
