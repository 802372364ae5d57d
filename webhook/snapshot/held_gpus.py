"""`HeldGpus`: the GPUs the cached pods hold, per namespace, kept as the pod cache changes."""

from __future__ import annotations

from collections.abc import Mapping

from webhook.snapshot.records import PodRecord

# -- GPUs held per namespace, kept as the pod cache changes ------------------------------------------
# Admission asks for a project's held GPUs on every GPU review; summing its pods each time costs
# with the project's size. The pod cache (`webhook.state.store`) adds and takes off each record as
# it comes and goes instead. Sums are kept exact, as whole multiples of 2**-1074 (every float is
# one), so a pod's GPUs added and taken off any number of times leave nothing behind: the index
# always equals `math.fsum` of the records it holds (tests/test_held_gpus.py).
_EXACT_BITS = 1074
_EXACT_ONE = 1 << _EXACT_BITS


def holds_gpus(record: PodRecord) -> bool:
    """A pod whose GPUs count against its project's deserved GPUs."""
    return bool(record.gpus) and not record.finished and not record.preemptible


def _exact(gpus: float) -> int:
    numerator, denominator = gpus.as_integer_ratio()  # denominator: a power of two
    return numerator << (_EXACT_BITS + 1 - denominator.bit_length())


class HeldGpus:
    """Namespace -> GPUs held by its pod records that `holds_gpus`; written only by the pod cache.
    `core.quota.pods_holding` reads it (and sums the records itself without one)."""

    __slots__ = ("_exact", "_value")

    def __init__(self) -> None:
        self._exact: dict[str, int] = {}
        self._value: dict[str, float] = {}

    def get(self, namespace: str) -> float:
        return self._value.get(namespace, 0.0)

    def without(self, namespace: str, record: PodRecord) -> float:
        """The namespace's held GPUs less `record`'s, when it is held (a review of a pod the cache has)."""
        if not holds_gpus(record):
            return self.get(namespace)
        return (self._exact.get(namespace, 0) - _exact(record.gpus)) / _EXACT_ONE

    def replace(self, old: PodRecord | None, new: PodRecord | None) -> None:
        """One record replaced by another (None: none), as the cache's dict was changed."""
        if old is not None:
            self._add(old, -1)
        if new is not None:
            self._add(new, 1)

    def drop(self, namespace: str) -> None:
        self._exact.pop(namespace, None)
        self._value.pop(namespace, None)

    def clear(self) -> None:
        self._exact.clear()
        self._value.clear()

    def rebuild(self, pods: Mapping[str, Mapping[str, PodRecord]]) -> None:
        self.clear()
        for records in pods.values():
            for record in records.values():
                self._add(record, 1)

    def _add(self, record: PodRecord, sign: int) -> None:
        if not holds_gpus(record):
            return
        namespace = record.namespace
        total = self._exact.get(namespace, 0) + sign * _exact(record.gpus)
        if total:
            self._exact[namespace] = total
            self._value[namespace] = total / _EXACT_ONE  # int / int: correctly rounded
        else:
            self.drop(namespace)
