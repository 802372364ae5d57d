"""The leader keeps the parameters of the compiled admission policies written
(`core.admission_policies`), and the namespace label their bindings select.

The policies and bindings themselves are static and installed by the chart
(templates/14-admission-policies.yaml): the server may not write admission policies, nor `get`
every ConfigMap, which the apiserver demands of whoever writes a policy with ConfigMap parameters.

Every replica follows its caches; only the Lease holder writes (`run`, started and cancelled with
leadership, beside the Run:ai reconciler). A pass computes the parameters from the snapshot
(`desired_params`) and applies by server-side apply, under one field manager, what differs from
what this leader last wrote or saw; it deletes the parameters of namespaces that are no longer
projects. Nothing here is on the request path: the apiserver reads the objects from its own
informers.

- When: at once on any cache write a namespace plan is made of (a Namespace, a PriorityClass, the
  settings, Kueue's objects; never a Pod or ReplicaSet), and every `resync_s`, when the parameters
  are listed again so that one deleted or changed by hand is put back.
- Order: a namespace's parameters before its label, which lets the bindings select it; when they
  are taken back, the label before the parameters.
- Where: only while the install enables it and the chart's four policy objects exist (read by name
  at each resync): `helm template` without the cluster's API versions leaves them out, and a
  namespace labelled without bindings would be decided by neither the policies nor the webhooks
  (whose selectors skip labelled namespaces). Otherwise a leader takes the label off and deletes
  the parameters an earlier pass wrote, so that the webhooks decide every pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping
from typing import Any

from webhook.core.admission_policies import (
    PARAMS_NAME,
    POLICIES_ON,
    POLICY_NAME,
    decided_by_policies,
    desired_params,
)
from webhook.kube.api import KubeApi, KubeError, KubeNotFound, Obj
from webhook.snapshot import ADMISSION_POLICIES_LABEL, ClusterSnapshot
from webhook.state.store import ClusterState
from webhook.tasks import wait_for_event

log = logging.getLogger(__name__)

FIELD_MANAGER = "scheduling-webhook"
# Kinds whose writes never change a namespace plan: no pass for them.
_IGNORED_KINDS = frozenset({"Pod", "ReplicaSet", "Deployment"})
# The chart's objects (templates/14-admission-policies.yaml), all named POLICY_NAME.
_INSTALLED = (
    "MutatingAdmissionPolicy",
    "MutatingAdmissionPolicyBinding",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
)
_DEFAULT_RESYNC_S = 60.0
_BACKOFF_MAX_S = 30.0

Key = tuple[str, str, str]  # (kind, namespace or "", name)


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj["metadata"]
    return str(obj["kind"]), str(meta.get("namespace") or ""), str(meta["name"])


def _content(obj: Mapping[str, Any]) -> str:
    """What is compared with what was written: the object as applied, in one canonical text."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


class PolicyWriter:
    def __init__(
        self,
        state: ClusterState,
        kube: KubeApi,
        *,
        enabled: bool,
        resync_s: float = _DEFAULT_RESYNC_S,
    ) -> None:
        self.state = state
        self.kube = kube
        self.enabled = enabled
        self.resync_s = resync_s
        self._wake = asyncio.Event()
        self._written: dict[Key, str] = {}  # what this leader applied, or found already there
        self.passes = 0  # completed passes (tests wait on it)
        self._resync_due = False
        self._missing: list[str] | None = None  # the chart's objects found missing at the last read

    def resync_soon(self) -> None:
        """Read the parameters back at the next pass, as at each resync."""
        self._resync_due = True
        self._wake.set()

    def on_cluster_event(self, event: str, kind: str, obj: Mapping[str, Any]) -> None:
        if kind not in _IGNORED_KINDS:
            self._wake.set()

    async def run(self) -> None:
        """While leading, until cancelled. A failed pass is logged and tried again with backoff."""
        self.state.listeners.append(self.on_cluster_event)
        self._written.clear()
        backoff = 1.0
        try:
            installed = False
            next_resync = 0.0
            while True:
                self._wake.clear()
                if not self.state.ready():  # an empty cache would look like no project at all
                    await wait_for_event(self._wake, 0.5)
                    continue
                now = time.monotonic()
                try:
                    checked = now >= next_resync or self._resync_due
                    if checked:
                        self._resync_due = False
                        installed = self.enabled and await self._installed()
                        if installed:
                            await self._read_back()
                        next_resync = now + self.resync_s
                    if not installed:
                        if checked:  # between reads of the chart's objects, nothing to take back
                            await self._remove_all()
                        if not self.enabled:
                            return
                    else:
                        snapshot = self.state.snapshot()
                        await self._write(desired_params(snapshot), snapshot)
                    self.passes += 1
                    backoff = 1.0
                except (KubeError, OSError, TimeoutError) as exc:
                    log.warning("admission policies: pass failed (%s); again in %.0f s", exc, backoff)
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, _BACKOFF_MAX_S)
                    self._resync_due = True  # the retry reads everything again
                    self._wake.set()
                    continue
                await wait_for_event(self._wake, max(0.0, next_resync - time.monotonic()))
        finally:
            with contextlib.suppress(ValueError):
                self.state.listeners.remove(self.on_cluster_event)

    async def _installed(self) -> bool:
        """Whether the chart's policies and bindings are all there (read by name)."""
        missing = [k for k in _INSTALLED if await self.kube.get_admission_object(k, POLICY_NAME) is None]
        if missing != self._missing:  # said once per change, not at every resync
            log.info("admission policies: %s", f"off (not installed: {', '.join(missing)})" if missing else "on")
            self._missing = missing
        return not missing

    async def _read_back(self) -> None:
        """What is stored now replaces what this leader remembers of the parameters, so that a
        ConfigMap changed or deleted by anyone else is written again, and one of a namespace that
        left the projects while no leader watched is found and deleted."""
        found = await self.kube.list_configmaps_named(PARAMS_NAME)
        self._written = {}
        for obj in found:
            meta = obj.get("metadata") or {}
            stored_meta: dict[str, Any] = {"name": meta.get("name"), "namespace": meta.get("namespace")}
            if meta.get("labels"):
                stored_meta["labels"] = meta["labels"]
            stored = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": stored_meta, "data": obj.get("data") or {}}
            self._written[_key(stored)] = _content(stored)

    async def _write(self, desired: list[Obj], snapshot: ClusterSnapshot) -> None:
        """Namespaces the policies no longer decide lose the label first (the webhooks take their
        pods back before anything else changes), then the parameters are applied, then namespaces
        the policies now decide, whose parameters exist, get it."""
        labelled = {
            name: record
            for name, record in snapshot.namespaces.items()
            if record.labels.get(ADMISSION_POLICIES_LABEL) == POLICIES_ON
        }
        for name, record in labelled.items():
            if record.is_project and not decided_by_policies(record, snapshot):
                await self._label(name, None)
        wanted = {_key(o): o for o in desired}
        params = desired
        changed = 0
        for obj in params:
            key = _key(obj)
            content = _content(obj)
            if self._written.get(key) == content:
                continue
            await self.kube.apply(obj, FIELD_MANAGER)
            self._written[key] = content
            changed += 1
        # Only now may the bindings select the namespace: its parameters exist.
        for obj in params:
            name = obj["metadata"]["namespace"]
            found = snapshot.namespaces.get(name)
            if found is not None and name not in labelled and decided_by_policies(found, snapshot):
                await self._label(name, POLICIES_ON)
        gone = [k for k in self._written if k not in wanted]
        for kind, namespace, name in gone:
            await self.kube.delete_object(kind, name, namespace)
            del self._written[(kind, namespace, name)]
        if changed or gone:
            log.info("admission policies: %d parameter ConfigMap(s) applied, %d deleted", changed, len(gone))

    async def _label(self, namespace: str, value: str | None) -> None:
        with contextlib.suppress(KubeNotFound):  # deleted meanwhile
            await self.kube.patch_namespace(namespace, {"metadata": {"labels": {ADMISSION_POLICIES_LABEL: value}}})

    async def _remove_all(self) -> None:
        """What an earlier pass wrote, taken back: the namespaces' label first (the webhooks take
        their pods back), then the parameters. The policies and bindings are the chart's."""
        self._written.clear()
        for record in list(self.state.snapshot().namespaces.values()):
            if ADMISSION_POLICIES_LABEL in record.labels and record.is_project:
                await self._label(record.name, None)
        found = await self.kube.list_configmaps_named(PARAMS_NAME)
        for obj in found:
            meta = obj.get("metadata") or {}
            await self.kube.delete_object("ConfigMap", PARAMS_NAME, str(meta.get("namespace")))
        if found:
            log.info("admission policies: off; %d parameter ConfigMap(s) deleted", len(found))
