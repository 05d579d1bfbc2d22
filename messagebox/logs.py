"""Structured logs: one JSON object per line, for log shippers (Loki, Elasticsearch,
CloudWatch…).

Every record carries ``time`` (UTC, ISO 8601), ``level``, ``logger`` and ``message``;
the engine adds fields of its own through ``extra=`` (``event``, ``host_instance``,
``host``, ``service``, ``entry``, ``message_id``, ``attempt``, ``error``…), which land as
top-level keys. ``messagebox host run --log-format json`` and ``messagebox console
--log-format json`` turn it on; in your own process call :func:`configure`.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

_STANDARD = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON, with its ``extra`` fields as keys."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str, ensure_ascii=False)


def configure(level: str | int = "INFO", fmt: str = "text") -> None:
    """Send the root logger's records to stderr, as text or as JSON lines."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log format must be 'text' or 'json', not {fmt!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
