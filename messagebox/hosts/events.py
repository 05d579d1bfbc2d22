"""How a host instance's parts log: the ``messagebox.hosts`` logger, and the structured
fields of each line (docs/operations.md, Structured logs)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from messagebox.errors import BackendUnavailable, MessageBoxError

log = logging.getLogger("messagebox.hosts")


@dataclass(frozen=True)
class InstanceLog:
    """The log lines of one host instance: its id and its host name every line."""

    instance: str
    host: str

    def fields(self, event: str, **fields: object) -> dict[str, object]:
        """The ``extra`` of a log line: its event, this instance and its host, and the
        event's own fields."""
        return {"event": event, "host_instance": self.instance, "host": self.host, **fields}

    def store_failed(self, what: str, exc: MessageBoxError, event: str) -> None:
        """Log a failed store call: an error, unless the store was unreachable (its
        ``store-lost`` line says so once, and ``store-back`` when it answers again):
        then at debug level, rather than a line for each try until it is back."""
        level = logging.DEBUG if isinstance(exc, BackendUnavailable) else logging.ERROR
        log.log(
            level,
            "host instance %s: %s failed: %s",
            self.instance,
            what,
            exc,
            extra=self.fields(event, error=str(exc)),
        )
