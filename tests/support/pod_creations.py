"""Pods created one after another through the real apiserver, both pod webhooks on their path, for
as long as something else happens (a helm upgrade rolling the replicas): every answer and when it
came. For the chart's lifecycle test (no refusal) and bench.helm_upgrade (the longest gap)."""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tests.support.control_plane.rest import Rest, RestError

IMAGE = "registry.example/notebook:1.0"


def notebook(name: str, namespace: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"hopsworks.ai/workload-type": "notebook"}},
            "spec": {"containers": [{"name": "main", "image": IMAGE}]}}  # fmt: skip


@dataclass
class Creations:
    """Pods created one after another through the apiserver (both webhooks on their path) until stopped."""

    rest: Rest
    namespace: str
    interval_s: float = 0.2
    results: list[tuple[float, float, int, str]] = field(default_factory=list)  # start, end, status, message
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Creations:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(30)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            start = time.monotonic()
            try:
                self.rest.call(
                    "POST", f"/api/v1/namespaces/{self.namespace}/pods", notebook(f"roll-{n}", self.namespace)
                )
                status, message = 201, ""
            except RestError as exc:
                status, message = exc.status, str(exc)
            except OSError as exc:
                status, message = 0, repr(exc)
            self.results.append((start, time.monotonic(), status, message))
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - start)))

    def refusals(self) -> list[str]:
        return [m for _, _, status, m in self.results if status != 201]

    def longest_gap_s(self, after: float = 0.0, before: float = float("inf")) -> float:
        """The longest time between two successive creations returning (the admission gap seen),
        over the creations that returned between `after` and `before` (monotonic clock)."""
        ends = [end for _, end, status, _ in self.results if status == 201 and after <= end < before]
        return max((b - a for a, b in itertools.pairwise(ends)), default=0.0)

    def slowest_s(self) -> float:
        return max((end - start for start, end, _, _ in self.results), default=0.0)
