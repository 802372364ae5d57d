"""Plain REST calls to the test apiserver as its admin (stdlib only: usable from any thread)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


class Rest:
    def __init__(self, url: str, ca_file: Path, cert_file: Path, key_file: Path) -> None:
        self.url = url
        self._ctx = ssl.create_default_context(cafile=str(ca_file))
        self._ctx.load_cert_chain(str(cert_file), str(key_file))

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json",
             timeout: float = 10) -> Any:  # fmt: skip
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._ctx, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise RestError(exc.code, exc.read().decode(errors="replace")) from None
        return json.loads(raw) if raw else None

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def merge_patch(self, path: str, body: Any) -> Any:
        return self.call("PATCH", path, body, "application/merge-patch+json")


class RestError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"{status}: {body[:500]}")
        self.status = status
