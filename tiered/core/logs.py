"""Log lines: plain text or one JSON object per line, each carrying the id of the request being handled.

``--log-format text`` (the default) writes ``time LEVEL logger: message``;
``--log-format json`` writes ``{"timestamp", "level", "logger", "message"}``
(plus ``exception`` with the traceback when there is one), one object per
line, so a message holding a newline cannot forge a second line. Either way,
a line logged while a request is handled carries that request's id
(``request_id``; see ``tiered.api.kit.middleware.request_id``), taken from a context
variable when the line is logged.

Structured lines (the access log, ``tiered.api.kit.middleware.access_log``) carry their
fields in ``extra={"fields": {...}}``: text renders them as `` key=value``
after the message, json as keys of the object (they never replace the
standard keys).

Only what the code puts in its messages and fields is logged: no headers, no
bodies, no credentials.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TextIO

#: The id of the request this task is handling (set by ``tiered.api.kit.middleware.request_id``).
REQUEST_ID: ContextVar[str | None] = ContextVar("tiered_request_id", default=None)

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ACCESS_LOGGER = "tiered.access"
_STANDARD_KEYS = frozenset(("timestamp", "level", "logger", "message", "request_id", "exception", "stack"))


class RequestIdFilter(logging.Filter):
    """Stamps each record with the current request id (``None`` outside requests)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = REQUEST_ID.get()
        return True


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT``, then `` key=value`` per field, then `` request_id=<id>`` on lines logged for a request."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "fields", None)
        if fields:
            line += "".join(f" {key}={value}" for key, value in fields.items())
        request_id = getattr(record, "request_id", None)
        return f"{line} request_id={request_id}" if request_id else line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: timestamp (UTC, ms), level, logger, message[, request_id][, exception]."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None)
        if request_id:
            entry["request_id"] = request_id
        fields = getattr(record, "fields", None)
        if fields:
            entry.update((k, v) for k, v in fields.items() if k not in _STANDARD_KEYS)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


def configure_logging(
    level: str, log_format: str, stream: TextIO | None = None, access_log: str = "errors"
) -> None:
    """Send every logger's lines to ``stream`` (stderr) in ``log_format``, at ``level`` and above.

    The access log (``tiered.access``) is written whatever ``level`` is, unless
    ``access_log`` is ``off``: which requests it covers is its own setting.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.CRITICAL + 1 if access_log == "off" else logging.INFO)
