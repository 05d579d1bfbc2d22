"""Every error messagebox raises.

MessageBoxError
├── ValidationError                 bad input; nothing was stored
│   ├── MessageValidationError      a message (names the message and the property)
│   ├── FilterValidationError       a filter (names the predicate)
│   └── UnknownAdapter              no adapter for a URL scheme (lists the known ones)
├── NotFound
│   ├── UnknownHost
│   ├── UnknownSubscription
│   ├── UnknownMessage
│   ├── UnknownSuspendedEntry
│   ├── UnknownFailureGroup         no failure group has the id (among the entries scanned)
│   ├── UnknownScheduledEntry       not on a queue, or due already
│   ├── UnknownInstance             no orchestration (service) instance of that id
│   └── UnknownUser                 no console user of that name
├── AlreadyExists                   a host, subscription or user name is taken
├── RoutingFailure                  policy "raise": a message matched no subscription
├── Throttled                       publishing refused while a threshold is passed
├── PermanentFailure                raised by a service: suspend the message, no retry
│   └── InstanceCompleted           the message reached a completed service instance
├── RetryLater                      raised by a service: retry after its own delay
├── AlreadyReceived                 a receipt was recorded before: that input was published
├── UserDisabled                    a console user's password was right, but it is disabled
├── HostExhausted                   hung handlers took a host instance's threads: it stopped
├── PipelineError                   a pipeline component refused a message (names it)
├── LeaseLost                       a step's queue entry was taken over: nothing committed
└── StorageError                    the database failed; the driver error is chained
    ├── Conflict                    a concurrent write won; nothing was written, retry
    └── BackendUnavailable          cannot connect, or the file is owned by another process
        └── NoSchema                the database (or its schema) does not exist, and was
                                    not created (``create=False``)
"""

from __future__ import annotations


class MessageBoxError(Exception):
    """A messagebox operation failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (type(self).__doc__ or "").strip())


class ValidationError(MessageBoxError):
    """Input was refused; nothing was stored."""


class MessageValidationError(ValidationError):
    """A message was refused; nothing of its batch was stored."""


class FilterValidationError(ValidationError):
    """A filter was refused."""


class NotFound(MessageBoxError):
    """No such object."""


class UnknownHost(NotFound):
    """No such host."""


class UnknownSubscription(NotFound):
    """No such subscription."""


class UnknownMessage(NotFound):
    """No such message."""


class UnknownSuspendedEntry(NotFound):
    """No such suspended entry."""


class UnknownFailureGroup(NotFound):
    """No such failure group."""


class UnknownScheduledEntry(NotFound):
    """No such scheduled queue entry (not on a queue, or due already)."""


class UnknownInstance(NotFound):
    """No such service instance."""


class UnknownUser(NotFound):
    """No such console user."""


class AlreadyExists(MessageBoxError):
    """An object with that name exists already."""


class RoutingFailure(MessageBoxError):
    """A message matched no subscription; the whole batch was rolled back."""


class Throttled(MessageBoxError):
    """Publishing is throttled: a host's queue is deeper than its threshold."""

    def __init__(self, message: str | None = None, *, hosts: list[str] | None = None) -> None:
        super().__init__(message)
        self.hosts = hosts or []


class PermanentFailure(MessageBoxError):
    """Raised by a service: the message can never succeed; suspend it without retrying."""

    reason: str = "delivery-failure"
    """The suspended entry's reason."""
    resumable: bool = True


class InstanceCompleted(PermanentFailure):
    """A message reached a service instance that has completed: it is suspended, not
    resumable, as "completed with discarded messages" (a zombie)."""

    reason = "completed-with-discarded-messages"
    resumable = False


class RetryLater(MessageBoxError):
    """Raised by a service: fail this delivery and retry it after ``delay`` seconds.

    The host's ``max_attempts`` does not apply: the service decides when to give up
    (by raising :class:`PermanentFailure`). Send ports use it for their own retry
    count and interval."""

    def __init__(self, message: str | None = None, *, delay: float = 0.0) -> None:
        super().__init__(message)
        self.delay = max(float(delay), 0.0)


class AlreadyReceived(MessageBoxError):
    """This input's receipt is recorded: it was published before, nothing was stored."""

    def __init__(self, message: str | None = None, *, message_ids: list[str] | None = None):
        super().__init__(message)
        self.message_ids = message_ids or []


class PipelineError(MessageBoxError):
    """A pipeline component refused a message.

    ``code`` is a short stable word (``malformed``, ``invalid``, ``missing-property``,
    ``bad-property``, ``too-large``, ``read-failed``, ``unknown-type``); ``component``
    names the component that refused it."""

    def __init__(self, message: str, *, code: str, component: str = "") -> None:
        super().__init__(f"{component}: {message}" if component else message)
        self.code = code
        self.component = component
        self.detail = message


class UnknownAdapter(ValidationError):
    """No adapter is registered for a URL's scheme."""


class StorageError(MessageBoxError):
    """The database failed; the driver error is chained as the cause."""

    def __init__(self, message: str | None = None, *, statement: str | None = None) -> None:
        super().__init__(message)
        self.statement = statement


class Conflict(StorageError):
    """Two transactions wrote the same row at once; the one that got this wrote nothing
    and may be retried (a DuckDB commit conflict, a PostgreSQL deadlock)."""


class LeaseLost(MessageBoxError):
    """The step's queue entry is no longer leased by this host instance: another one
    took it over, and this step is not committed."""


class BackendUnavailable(StorageError):
    """The database cannot be reached or opened."""


class NoSchema(BackendUnavailable):
    """The database, or its messagebox schema, does not exist and was not created."""


class UserDisabled(MessageBoxError):
    """A console user's password was right, but the user is disabled."""


class HostExhausted(MessageBoxError):
    """A host instance stopped itself: handlers abandoned past their time-out still hold
    every thread it may start. Its entries were given back; start it again."""
