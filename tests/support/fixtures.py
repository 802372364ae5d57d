"""Helpers every test module may use to read the server's own Prometheus registry.

remote_calls(target, path)   the server's own count of its remote calls (webhook_remote_calls_total),
                             so a test proves which calls a step made, and on which path
metric(name, **labels)       any Prometheus sample of the server's registry, 0 when absent
"""

from __future__ import annotations

from typing import Literal

from webhook.metrics import REGISTRY


def metric(name: str, **labels: str) -> float:
    """One sample of the server's registry; a labelled series never touched reads as 0."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def remote_calls(target: Literal["kubernetes", "runai"], path: Literal["request", "background"]) -> float:
    """How many remote calls the server counted: `request` ones are made while an admission waits."""
    return metric("webhook_remote_calls_total", target=target, path=path)
