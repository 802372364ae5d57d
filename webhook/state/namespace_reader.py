"""Reading a namespace the watch has not delivered yet, for the pod webhooks.

A project namespace and its first pod can be created within moments: the pod's review may arrive
before this replica's namespace watch shows the namespace. That pod must be decided on the
namespace, not passed as if it were no project's, so the handler reads it here: one GET, counted
on the request path, bounded in time, shared by every request waiting for the same namespace
(`SharedCalls`, at most `MAX_READS_IN_FLIGHT` namespaces at once). What it reads goes into the
cache as a watch event would, unless the watch delivered the namespace meanwhile (its record is
then the newer one).
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

from webhook.kube.api import KubeApi, KubeError, KubeNotFound
from webhook.shared_calls import SharedCalls, TooManyCalls
from webhook.state.store import ClusterState

log = logging.getLogger(__name__)

# Namespaces read at once by one replica: more is a burst of new projects, not normal work.
MAX_READS_IN_FLIGHT = 32
# Inside /mutate/pods' 10 s, which may still bind the project after this read.
READ_TIMEOUT_S = 2.0


class NamespaceUnreadable(Exception):
    """The namespace could not be read now; the message says why."""


class NamespaceReader:
    def __init__(
        self,
        state: ClusterState,
        kube: KubeApi,
        *,
        timeout_s: float = READ_TIMEOUT_S,
        limit: int = MAX_READS_IN_FLIGHT,
    ) -> None:
        self._state = state
        self._kube = kube
        self.timeout_s = timeout_s
        self._reads: SharedCalls[str, None] = SharedCalls(limit, "namespace reads")

    async def read(self, namespace: str) -> None:
        """Put `namespace` in the cache. Raises NamespaceUnreadable."""
        try:
            await self._reads.call(namespace, lambda: self._read(namespace))
        except TooManyCalls as exc:
            raise NamespaceUnreadable(str(exc)) from None

    async def _read(self, namespace: str) -> None:
        try:
            async with asyncio.timeout(self.timeout_s):
                obj = await self._kube.get_namespace(namespace, call_path="request")
        except TimeoutError:
            raise NamespaceUnreadable(f"the Kubernetes API did not answer within {self.timeout_s:g} s") from None
        except KubeNotFound:
            raise NamespaceUnreadable("the Kubernetes API has no such namespace") from None
        except (KubeError, aiohttp.ClientError) as exc:
            raise NamespaceUnreadable(f"reading it failed: {exc}") from None
        if namespace not in self._state.namespaces:
            log.info("namespace %s read on admission, before its watch event", namespace)
            self._state.apply({**obj, "kind": "Namespace"})
