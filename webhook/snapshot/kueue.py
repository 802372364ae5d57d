"""Frozen records of Kueue's objects: LocalQueues, ClusterQueues, ResourceFlavors, Topologies."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from webhook.snapshot.fields import count_of, mappings, object_meta, section

# -- Kueue's objects, as its v1beta2 API (v0.15+) has them; v1beta1 field names are read too --------
# Quantities are kept as Kueue wrote them (shown, never added up here), and only when they are
# short strings: a stored object of any shape must not stop a cache from syncing.
_MAX_QUANTITY_CHARS = 40


def _quantity(value: Any) -> str | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        value = str(value)
    return value if isinstance(value, str) and 0 < len(value) <= _MAX_QUANTITY_CHARS else None


@dataclass(frozen=True, slots=True)
class LocalQueueInfo:
    """A LocalQueue: a namespace's name for a ClusterQueue (`spec.clusterQueue`)."""

    namespace: str
    name: str
    cluster_queue: str
    pending: int = 0  # status.pendingWorkloads
    admitted: int = 0  # status.admittedWorkloads

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> LocalQueueInfo:
        meta, status = object_meta(obj), section(obj, "status")
        cluster_queue = section(obj, "spec").get("clusterQueue")
        return cls(
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
            cluster_queue=cluster_queue if isinstance(cluster_queue, str) else "",
            pending=count_of(status.get("pendingWorkloads")),
            admitted=count_of(status.get("admittedWorkloads")),
        )


@dataclass(frozen=True, slots=True)
class FlavorResources:
    """One flavor of a ClusterQueue: nominal quota (spec) and usage (status.flavorsUsage) per
    resource, as Kueue writes the quantities."""

    flavor: str
    nominal: Mapping[str, str] = field(default_factory=dict)
    usage: Mapping[str, str] = field(default_factory=dict)
    borrowed: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ClusterQueueInfo:
    """A ClusterQueue: its flavors in the order Kueue tries them, its cohort and Kueue's status."""

    name: str
    flavors: tuple[FlavorResources, ...] = ()
    cohort: str | None = None
    pending: int = 0  # status.pendingWorkloads
    admitted: int = 0  # status.admittedWorkloads
    active: bool | None = None  # the Active condition; None: Kueue has not reported it
    inactive_reason: str | None = None

    @property
    def flavor_names(self) -> tuple[str, ...]:
        return tuple(f.flavor for f in self.flavors)

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ClusterQueueInfo:
        spec, status = section(obj, "spec"), section(obj, "status")
        nominal: dict[str, dict[str, str]] = {}
        for group in mappings(spec.get("resourceGroups")):
            for flavor in mappings(group.get("flavors")):
                name = flavor.get("name")
                if not isinstance(name, str) or name in nominal:
                    continue
                nominal[name] = {
                    str(r["name"]): q
                    for r in mappings(flavor.get("resources"))
                    if isinstance(r.get("name"), str) and (q := _quantity(r.get("nominalQuota"))) is not None
                }
        usage: dict[str, dict[str, str]] = {}
        borrowed: dict[str, dict[str, str]] = {}
        for flavor in mappings(status.get("flavorsUsage")):
            name = flavor.get("name")
            if not isinstance(name, str):
                continue
            for r in mappings(flavor.get("resources")):
                if not isinstance(r.get("name"), str):
                    continue
                if (total := _quantity(r.get("total"))) is not None:
                    usage.setdefault(name, {})[r["name"]] = total
                if (lent := _quantity(r.get("borrowed"))) is not None:
                    borrowed.setdefault(name, {})[r["name"]] = lent
        active: bool | None = None
        reason: str | None = None
        for condition in mappings(status.get("conditions")):
            if condition.get("type") == "Active":
                active = condition.get("status") == "True"
                reason = None if active else str(condition.get("reason") or "") or None
        cohort = spec.get("cohortName", spec.get("cohort"))  # v1beta2 renamed spec.cohort
        return cls(
            name=str(object_meta(obj).get("name") or ""),
            flavors=tuple(FlavorResources(n, q, usage.get(n, {}), borrowed.get(n, {})) for n, q in nominal.items()),
            cohort=cohort if isinstance(cohort, str) and cohort else None,
            pending=count_of(status.get("pendingWorkloads")),
            admitted=count_of(status.get("admittedWorkloads")),
            active=active,
            inactive_reason=reason,
        )


@dataclass(frozen=True, slots=True)
class ResourceFlavorInfo:
    """A ResourceFlavor; `topology` names the Topology its nodes are placed by (TAS), if any."""

    name: str
    topology: str | None = None

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> ResourceFlavorInfo:
        topology = section(obj, "spec").get("topologyName")
        return cls(
            name=str(object_meta(obj).get("name") or ""),
            topology=topology if isinstance(topology, str) and topology else None,
        )


@dataclass(frozen=True, slots=True)
class TopologyInfo:
    """A Topology: its levels' node labels, coarsest first (`spec.levels[].nodeLabel`)."""

    name: str
    levels: tuple[str, ...] = ()

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> TopologyInfo:
        levels = [level.get("nodeLabel") for level in mappings(section(obj, "spec").get("levels"))]
        return cls(
            name=str(object_meta(obj).get("name") or ""),
            levels=tuple(label for label in levels if isinstance(label, str) and label),
        )
