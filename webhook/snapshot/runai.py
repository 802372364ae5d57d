"""Frozen records of Run:ai's projects and departments, as the directory's last refresh saw them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RunaiDepartmentInfo:
    """The Run:ai department of a project, on the project's default node pool, as the last refresh
    saw it: the parent queue the scheduler also holds a non-preemptible pod to."""

    id: str
    name: str
    deserved_gpus: float = 0.0  # -1: no quota (Run:ai's and the scheduler's "unlimited")
    allocated_non_preemptible: float = 0.0  # Run:ai's count, summed over the department's projects
    sampled_at: float = 0.0  # epoch seconds Run:ai's answer arrived


@dataclass(frozen=True, slots=True)
class RunaiProjectInfo:
    """A Run:ai project bound to a namespace, as the last refresh saw it."""

    id: str
    name: str
    namespace: str
    deserved_gpus: float = 0.0  # on `node_pool`
    node_pool: str | None = None  # the project's default node pool (see `core.gpu_view.default_node_pool`)
    allocated_non_preemptible: float = 0.0  # Run:ai's count on `node_pool`
    sampled_at: float = 0.0  # epoch seconds Run:ai's answer arrived
    department: RunaiDepartmentInfo | None = None  # None: no record of it, so no department limit


def department_namespaces(projects: Mapping[str, RunaiProjectInfo] | None) -> dict[str, frozenset[str]]:
    """The namespaces of `projects` (by namespace) grouped by their department's id."""
    grouped: dict[str, set[str]] = {}
    for namespace, project in (projects or {}).items():
        if project.department is not None:
            grouped.setdefault(project.department.id, set()).add(namespace)
    return {department: frozenset(names) for department, names in grouped.items()}
