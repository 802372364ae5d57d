"""Kubernetes Events about namespaces (the binder's and the reconciler's courtesy notes)."""

from __future__ import annotations

import asyncio
import logging

from webhook.kube.api import KubeApi, Obj
from webhook.snapshot import NamespaceInfo

log = logging.getLogger(__name__)


class EventRecorder:
    """Kubernetes Events about namespaces, sent in the background so no caller waits for them.

    The same (namespace, reason, message) is sent once: a reconcile pass every few minutes must
    not add an Event per pass for the same drift or failure.
    """

    def __init__(self, kube: KubeApi) -> None:
        self.kube = kube
        self._sent: dict[tuple[str, str], str] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def record(
        self,
        namespace: Obj | NamespaceInfo | str,
        reason: str,
        message: str,
        *,
        warning: bool = False,
        once: bool = True,
    ) -> None:
        name, uid = _identity(namespace)
        if once and self._sent.get((name, reason)) == message:
            return
        self._sent[(name, reason)] = message
        involved = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "uid": uid}}
        task = asyncio.create_task(self._send(involved, reason, message, warning))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def forget(self, namespace: str, reason: str | None = None) -> None:
        """Let the next event of this kind through again (the condition went away)."""
        for key in [k for k in self._sent if k[0] == namespace and reason in (None, k[1])]:
            del self._sent[key]

    async def _send(self, involved: Obj, reason: str, message: str, warning: bool) -> None:
        try:
            await self.kube.create_event(involved, reason, message, type_="Warning" if warning else "Normal")
        except Exception as exc:  # an event is a courtesy; never fail the work for it
            log.info("event %s for namespace %s not recorded: %s", reason, involved["metadata"]["name"], exc)

    def cancel(self) -> None:
        for task in self._tasks:
            task.cancel()

    async def flush(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


def _identity(namespace: Obj | NamespaceInfo | str) -> tuple[str, str]:
    if isinstance(namespace, str):
        return namespace, ""
    if isinstance(namespace, NamespaceInfo):
        return namespace.name, ""
    meta = namespace.get("metadata") or {}
    return str(meta.get("name", "")), str(meta.get("uid", ""))
