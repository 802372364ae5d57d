"""Caller-controlled text in log lines: one line, bounded, and visibly escaped.

A value from a request (an AdmissionReview uid, a URL path segment, an apiserver error body) can
hold newlines that would start a forged log line, control characters that rewrite a terminal, or
megabytes. `log_safe` escapes everything outside printable ASCII (backslash escapes, as Python
writes them) and cuts the result at `limit` characters, saying how long the original was.
"""

from __future__ import annotations

from typing import Any

DEFAULT_LIMIT = 120


def log_safe(value: Any, limit: int = DEFAULT_LIMIT) -> str:
    text = value if isinstance(value, str) else repr(value)
    # Look at no more than a bounded prefix: escaping 1 MB to keep 120 characters is waste.
    head = text[: limit + 1]
    escaped = head.encode("unicode_escape", errors="backslashreplace").decode("ascii")
    escaped = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in escaped)
    if len(text) > limit or len(escaped) > limit:
        return f"{escaped[:limit]}... ({len(text)} characters)"
    return escaped
