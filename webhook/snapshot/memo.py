"""`NamespaceMemo`: per-namespace plans, kept between reviews until a write they depend on."""

from __future__ import annotations


class NamespaceMemo:
    """What decisions derive from a namespace and the cluster objects around it (`core.namespace_plan`),
    kept by namespace name. The store empties it whenever it writes one of the objects the plans
    read (a Namespace, a PriorityClass, the settings, a LocalQueue or any Kueue object); `generation`
    counts those emptyings. Keyed only by namespaces the snapshot holds, so bounded by them."""

    __slots__ = ("generation", "plans")

    def __init__(self) -> None:
        self.plans: dict[str, object] = {}
        self.generation = 0

    def clear(self) -> None:
        self.plans.clear()
        self.generation += 1
