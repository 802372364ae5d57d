"""Fixtures and helpers every test module may use: a pytest plugin, registered in tests/conftest.py.

kube          a KubeEmulator (the apiserver the tests play), seeded with the objects of `kube_objects`
kube_objects  what `kube` holds before the test starts; a module overrides it:
                  @pytest.fixture
                  def kube_objects() -> list[Obj]:
                      return [namespace(INSTALL_NS)]
api           a kubernetes_asyncio ApiClient talking to `kube`

remote_calls(target, path)   the server's own count of its remote calls (webhook_remote_calls_total),
                             so a test proves which calls a step made, and on which path
metric(name, **labels)       any Prometheus sample of the server's registry, 0 when absent
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal

import pytest
from kubernetes_asyncio.client import ApiClient

from tests.support.kube_emulator import KubeEmulator
from webhook.metrics import REGISTRY

Obj = Mapping[str, Any]


def metric(name: str, **labels: str) -> float:
    """One sample of the server's registry; a labelled series never touched reads as 0."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def remote_calls(target: Literal["kubernetes", "runai"], path: Literal["request", "background"]) -> float:
    """How many remote calls the server counted: `request` ones are made while an admission waits."""
    return metric("webhook_remote_calls_total", target=target, path=path)


@pytest.fixture
def kube_objects() -> list[Obj]:
    """What the emulated cluster holds at the start: nothing, unless the module says otherwise."""
    return []


@pytest.fixture
async def kube(kube_objects: list[Obj]) -> AsyncIterator[KubeEmulator]:
    async with KubeEmulator() as emulator:
        for obj in kube_objects:
            emulator.put_object(obj)
        yield emulator


@pytest.fixture
async def api(kube: KubeEmulator) -> AsyncIterator[ApiClient]:
    async with kube.api_client() as api_client:
        yield api_client
