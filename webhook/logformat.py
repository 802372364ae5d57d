"""How the process writes its log: plain text lines (the default), or one JSON object per line for
a log pipeline that parses fields rather than text (`--log-format json`, the chart's `logFormat`).

A JSON line holds `time` (UTC, RFC 3339), `level`, `logger`, `message`, and `uid`, the
AdmissionReview uid, when the line is written while a review is being decided (the admission
handlers set `REVIEW_UID`; `extra={"uid": ...}` names one explicitly); a traceback goes in
`exception`. `json.dumps` escapes a newline a message may quote, so one record stays one line.
"""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import TextIO

from webhook.logsafe import log_safe

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# The uid is the caller's: bounded like every caller-controlled value in a log line.
UID_CHARS = 64

# The uid of the review being decided. The raw value: it is escaped only when a line is written,
# so a review that logs nothing pays for a set and a reset alone.
REVIEW_UID: ContextVar[object] = ContextVar("review_uid", default=None)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, str] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        uid = getattr(record, "uid", None) or REVIEW_UID.get()
        if uid:
            entry["uid"] = log_safe(uid, UID_CHARS)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(level: str, log_format: str = "text", stream: TextIO | None = None) -> None:
    """As `logging.basicConfig`: nothing changes when the root logger has a handler already (a
    test's capture, an embedding program's own)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
