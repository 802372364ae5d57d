"""The chart as the real apiserver reads it: for every choice the values offer, `helm lint` passes
and every object `helm template` renders passes the apiserver's own validation (OpenAPI schemas,
strict field checking, CEL compilation of the ValidatingAdmissionPolicies, the add-ons' CRD
schemas), and the installed policies type-check.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Cluster
from tests.support import chart, peers
from tests.support.control_plane.install import render

pytestmark = pytest.mark.slow

RUNAI_ON = {"run_ai_enable": True, "run_ai_client_id": "hopsworks", "run_ai_project_gpu_quota": 2}
OTHER_NAMESPACE = "platform-scheduling"
VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "runai-on": {"variables": RUNAI_ON},
    "kueue-on": {"variables": {"kueue_installed": True}},
    "kueue-on-in-the-umbrella": {"global": {"_hopsworks": {"kueue": {"enabled": True}}}},
    "network-policy": {"networkPolicy": {"enabled": True, "apiserverCIDRs": ["10.0.0.10/32"]}},
    "certs-cert-manager": {"certs": {"mode": "certManager"}},
    "certs-cert-manager-issuer": {"certs": {"mode": "certManager", "certManager": {"issuerRef": {
        "kind": "ClusterIssuer", "name": "corp-ca"}}}},
    "certs-secret": {"certs": {"mode": "secret", "secret": {"caBundle": "LS0tLQ=="}}},
    "client-ca": {"certs": {"clientCAKey": "ca.crt"}},
    "admission-client-ca": {"admission": {"clientCA": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
                                          "clientNames": ["kube-apiserver-webhook-client"]}},
    "scrape-annotations": {"metrics": {"scrapeAnnotations": True}},
    "service-monitor": {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"},
                                                        "interval": "15s"}}},
    "scheduling-and-security": {
        "imagePullSecrets": [{"name": "registry"}], "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
        "podLabels": {"team": "platform"}, "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
        "serviceAccount": {"annotations": {"iam.example.com/role": "webhook"}},
        "podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None},
        "securityContext": {"runAsUser": None, "runAsGroup": None},
    },
    "alert-rules": {"metrics": {"alertRules": True}},
    "one-replica": {"replicas": 1},
    "other-namespace": {},
    "plain-yaml": yaml.safe_load(chart.PLAIN_VALUES.read_text()),
}  # fmt: skip


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
def test_helm_lint_passes_for_every_choice(variant: str) -> None:
    namespace = OTHER_NAMESPACE if variant == "other-namespace" else "hopsworks"
    out = chart.helm("lint", str(chart.CHART), "--strict", "--namespace", namespace, values=VARIANTS[variant])
    assert "1 chart(s) linted, 0 chart(s) failed" in out, out


@pytest.mark.parametrize("variant", list(VARIANTS))
async def test_every_render_passes_the_apiservers_validation(cluster: Cluster, variant: str, tmp_path: Path) -> None:
    cluster.needs_local("dry-runs renders beside the harness's install")
    await install_addon_crds(cluster)
    values = VARIANTS[variant]
    namespace = OTHER_NAMESPACE if variant == "other-namespace" else "hopsworks"
    text = await asyncio.to_thread(render, values, tmp_path, namespace)
    objects = [o for o in yaml.safe_load_all(text) if o]
    kinds = sorted({o["kind"] for o in objects})
    if namespace != "hopsworks":  # a dry run stores nothing, not even the namespace its objects need
        await cluster.ok("create", "namespace", namespace)
        cluster.namespaces.append(namespace)
    if variant == "runai-on":
        assert any(o["metadata"].get("namespace") == "runai" for o in objects)  # the harness made `runai`
    out = await cluster.ok("apply", "--server-side", "--dry-run=server", "--validate=strict", "--force-conflicts",
                           "-f", "-", stdin=text)  # fmt: skip
    assert out.count("(server dry run)") == len(objects), out
    if variant.startswith("certs-cert-manager"):
        assert "Certificate" in kinds and ("Issuer" in kinds) == (variant == "certs-cert-manager"), kinds
    if variant == "service-monitor":
        assert "ServiceMonitor" in kinds, kinds
    if variant == "alert-rules":
        assert "PrometheusRule" in kinds, kinds
    if variant == "network-policy":
        assert "NetworkPolicy" in kinds, kinds
    if variant in ("one-replica", "plain-yaml"):
        assert ("PodDisruptionBudget" in kinds) == (variant == "plain-yaml"), kinds


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
