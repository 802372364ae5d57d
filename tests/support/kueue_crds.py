"""Kueue's CRDs (v0.17.0, from `make peers`) on the shared control plane, without its manager: the
apiserver then serves the Kueue kinds the Runtime caches, at v1beta2 and v1beta1, as a cluster with
Kueue installed does. Removed afterwards with every object of theirs, so that later tests meet a
cluster without Kueue again."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tests.support import peers
from tests.support.control_plane.cluster import ControlPlane

# The kinds the Runtime caches (webhook.state.watches), one CRD each.
CACHED = ("clusterqueues", "localqueues", "resourceflavors", "topologies")


@contextmanager
def kueue_crds(cp: ControlPlane, within_s: float = 60.0) -> Iterator[None]:
    files = [peers.share(f"kueue/crds/kueue.x-k8s.io_{plural}.yaml") for plural in CACHED]
    names = [f"crd/{plural}.kueue.x-k8s.io" for plural in CACHED]
    cp.kubectl("apply", "--server-side", *(a for f in files for a in ("-f", str(f))))
    try:
        cp.kubectl("wait", "--for=condition=Established", f"--timeout={within_s:.0f}s", *names,
                   timeout=within_s + 10)  # fmt: skip
        yield
    finally:
        cp.kubectl("delete", *names, "--ignore-not-found", "--wait=true", timeout=within_s)
