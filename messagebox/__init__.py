"""messagebox: content-based publish/subscribe routing in the style of the BizTalk
MessageBox. Start with :class:`MessageBox`, :class:`Message` and ``predicates.P``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from messagebox.errors import (
    AlreadyExists,
    BackendUnavailable,
    FilterValidationError,
    MessageBoxError,
    MessageValidationError,
    NoSchema,
    NotFound,
    RoutingFailure,
    StorageError,
    Throttled,
    UnknownHost,
    UnknownMessage,
    UnknownScheduledEntry,
    UnknownSubscription,
    UnknownSuspendedEntry,
    ValidationError,
)

DISTRIBUTION = "messagebox-router"
"""The distribution that installs this package (``__version__`` is its version)."""

if TYPE_CHECKING:
    __version__: str
    from messagebox.engine import MessageBox
    from messagebox.message import Message, MessageSummary, StoredMessage
    from messagebox.models import (
        Host,
        HostSettings,
        HostStats,
        Kind,
        Outcome,
        QueueDepth,
        QueueStats,
        Routed,
        RouteExplanation,
        RoutingPolicy,
        State,
        Stats,
        Subscription,
        SubscriptionExplanation,
        SuspendedEntry,
    )

_LAZY = {
    "MessageBox": "messagebox.engine",
    "Message": "messagebox.message",
    "StoredMessage": "messagebox.message",
    "MessageSummary": "messagebox.message",
    **dict.fromkeys(
        (
            "Host",
            "HostSettings",
            "HostStats",
            "Kind",
            "Outcome",
            "QueueDepth",
            "QueueStats",
            "RouteExplanation",
            "Routed",
            "RoutingPolicy",
            "State",
            "Stats",
            "Subscription",
            "SubscriptionExplanation",
            "SuspendedEntry",
        ),
        "messagebox.models",
    ),
}


if not TYPE_CHECKING:  # type checkers see the imports above, so a misspelt name fails

    def __getattr__(name: str) -> Any:
        # Lazy, so that ``predicates`` can import ``messagebox.errors`` without importing
        # the engine (which imports ``predicates``).
        if name in _LAZY:
            import importlib

            return getattr(importlib.import_module(_LAZY[name]), name)
        if name == "__version__":  # read once, when asked: the metadata costs 20 ms
            global __version__
            __version__ = version()
            return __version__
        raise AttributeError(f"module 'messagebox' has no attribute {name!r}")


def version() -> str:
    """The installed distribution's version (``0+unknown`` when it is not installed:
    the source tree run as it is)."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"


__all__ = [
    "AlreadyExists",
    "BackendUnavailable",
    "FilterValidationError",
    "Host",
    "HostSettings",
    "HostStats",
    "Kind",
    "Message",
    "MessageBox",
    "MessageBoxError",
    "MessageSummary",
    "MessageValidationError",
    "NoSchema",
    "NotFound",
    "Outcome",
    "QueueDepth",
    "QueueStats",
    "RouteExplanation",
    "Routed",
    "RoutingFailure",
    "RoutingPolicy",
    "State",
    "Stats",
    "StorageError",
    "StoredMessage",
    "Subscription",
    "SubscriptionExplanation",
    "SuspendedEntry",
    "Throttled",
    "UnknownHost",
    "UnknownMessage",
    "UnknownScheduledEntry",
    "UnknownSubscription",
    "UnknownSuspendedEntry",
    "ValidationError",
    "__version__",
]
