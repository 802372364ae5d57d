"""The install as the real apiserver reads it: every object of every render the values offer
passes the apiserver's own validation (OpenAPI schemas, strict field checking, CEL compilation of
the ValidatingAdmissionPolicies, the add-ons' CRD schemas), and the installed policies type-check.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Cluster
from tests.support import peers
from tests.support.control_plane.install import render

pytestmark = pytest.mark.slow

RUNAI_ON = {"run_ai_enable": True, "run_ai_client_id": "hopsworks", "run_ai_project_gpu_quota": 2}
VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "runai-on": {"settings": RUNAI_ON},
    "kueue-on": {"settings": {"kueue_installed": True}},
    "network-policy": {"networkPolicy": {"enabled": True, "apiserverCIDRs": ["10.0.0.10/32"]}},
    "cert-manager": {"certManager": {"enabled": True}},
    "scrape-annotations": {"metrics": {"scrapeAnnotations": True}},
    "service-monitor": {"metrics": {"serviceMonitor": True}},
    "client-ca": {"clientCAKey": "ca.crt"},
    "other-namespace": {"namespace": "platform-scheduling"},
}


async def install_addon_crds(cluster: Cluster) -> None:
    """cert-manager's and the Prometheus Operator's CRDs (from their Go modules, `make peers`)."""
    for folder in ("crds/cert-manager", "crds/prometheus-operator"):
        files = sorted(peers.share(folder).glob("*.yaml"))
        text = "\n---\n".join(f.read_text() for f in files)
        await cluster.ok("apply", "--server-side", "--force-conflicts", "-f", "-", stdin=text)
    for crd in ("certificates.cert-manager.io", "issuers.cert-manager.io", "servicemonitors.monitoring.coreos.com"):
        # Not `kubectl wait`: it fails on a CRD whose status has no conditions yet.
        async def established(crd: str = crd) -> bool:
            conditions = (await cluster.get("crd", crd)).get("status", {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        await cluster.eventually(established, f"{crd} established")


@pytest.mark.parametrize("variant", list(VARIANTS))
async def test_every_render_passes_the_apiservers_validation(cluster: Cluster, variant: str, tmp_path: Path) -> None:
    local = cluster.needs_local("renders the install with the harness's CA")
    await install_addon_crds(cluster)
    # cert-manager's CA injector fills the caBundle: that render takes no CA file.
    ca = {} if variant == "cert-manager" else {"caFile": local.values["caFile"]}
    values = {**ca, **VARIANTS[variant]}
    text = await asyncio.to_thread(render, values, tmp_path)
    kinds = sorted({o["kind"] for o in yaml.safe_load_all(text) if o})
    namespace = values.get("namespace", "hopsworks")
    if namespace != "hopsworks":  # a dry run stores nothing, not even the namespace its objects need
        await cluster.ok("create", "namespace", namespace)
        cluster.namespaces.append(namespace)
    out = await cluster.ok("apply", "--server-side", "--dry-run=server", "--validate=strict", "--force-conflicts",
                           "-f", "-", stdin=text)  # fmt: skip
    assert out.count("(server dry run)") == len([o for o in yaml.safe_load_all(text) if o]), out
    if variant == "cert-manager":
        assert {"Certificate", "Issuer"} <= set(kinds), kinds
    if variant == "service-monitor":
        assert "ServiceMonitor" in kinds, kinds
    if variant == "network-policy":
        assert "NetworkPolicy" in kinds, kinds


async def test_the_installed_policies_type_check(cluster: Cluster) -> None:
    """The apiserver compiles and type-checks each policy's CEL against the types it matches and
    reports what it could not check in the policy's status."""
    for name in ("hopsworks-scheduling-webhook-own-objects", "hopsworks-scheduling-webhook-namespaces"):

        async def checked(name: str = name) -> Any:
            policy = await cluster.get("validatingadmissionpolicy", name)
            status = policy.get("status") or {}
            return status if status.get("observedGeneration") == policy["metadata"]["generation"] else None

        status = await cluster.eventually(checked, f"{name} type-checked by the status controller", within_s=60)
        assert not (status.get("typeChecking") or {}).get("expressionWarnings"), status
