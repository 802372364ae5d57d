"""Which Run:ai project the directory publishes for each namespace, from a list of projects (a
refresh's, or a lookup's of one namespace) and the namespace cache as it is when the list is
published.

A namespace's `runai/queue` label names its project; failing that, a project Run:ai bound to the
namespace counts. A project-id label that names another project vetoes it: that project was
replaced by a department move (carried out by any replica), even when a list read before the move
still shows it, and the quota must not be counted against it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from webhook.core.runai_data import RunaiProject
from webhook.snapshot import NamespaceInfo


def replaced(ns: NamespaceInfo, project_id: str) -> bool:
    """The namespace is labelled with another project's id than `project_id`. Without an id label
    (a project adopted by name) nothing says it was replaced."""
    return ns.runai_project_id is not None and ns.runai_project_id != project_id


def projects_by_namespace(
    namespaces: Mapping[str, NamespaceInfo], projects: Sequence[RunaiProject]
) -> dict[str, RunaiProject]:
    """Namespace name -> its project: the one its `runai/queue` label names (the last listed of that
    name), else the first bound to it; never one the namespace's id label says was replaced.
    Namespaces the cache does not have are kept by binding (nothing to compare against)."""
    named: dict[str, list[RunaiProject]] = {}
    for project in projects:
        named.setdefault(project.name, []).append(project)
    out: dict[str, RunaiProject] = {}
    for ns in namespaces.values():
        queue = ns.runai_queue
        found = next((p for p in reversed(named.get(queue, ())) if not replaced(ns, p.id)), None) if queue else None
        if found is not None:
            out[ns.name] = found
    for project in projects:
        for name in (project.requested_namespace, project.namespace):
            if not name or name in out:
                continue
            cached = namespaces.get(name)
            if cached is None or not replaced(cached, project.id):
                out[name] = project
    return out


def project_for(namespace: str, ns: NamespaceInfo | None, projects: Sequence[RunaiProject]) -> RunaiProject | None:
    """The project `projects_by_namespace` would publish for `namespace` alone, `ns` being its cache
    entry as it is now (None: not in the cache): a lookup of one namespace follows the same rule as
    a refresh, so among several projects of its name it takes the one its id label names."""
    return projects_by_namespace({namespace: ns} if ns is not None else {}, projects).get(namespace)
