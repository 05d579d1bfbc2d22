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

if TYPE_CHECKING:
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
        raise AttributeError(f"module 'messagebox' has no attribute {name!r}")


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
]
