"""Objects the rendered manifests add beside `manifests/`'s files when the values switch them on:
cert-manager's Issuer and Certificate, the Prometheus Operator's ServiceMonitor, and the
prometheus.io scrape annotations. `webhook.manifests` decides when; this builds them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SERVICE_NAME = "scheduling-webhook"  # the Service the apiserver calls

SCRAPE_ANNOTATIONS = {
    "prometheus.io/scrape": "true",
    "prometheus.io/scheme": "https",
    "prometheus.io/port": "8444",  # the probes listener (--probe-port): TLS, no client certificate
    "prometheus.io/path": "/metrics",
}
LABELS = {"app.kubernetes.io/name": SERVICE_NAME, "app.kubernetes.io/part-of": "hopsworks"}


def cert_manager_objects(namespace: str, secret_name: str, values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A Certificate for the Service's names into the TLS Secret the pods mount; with no issuerRef,
    a self-signed Issuer of its own (the CA injector then puts that certificate in caBundle).
    cert-manager renews the Secret before it expires; the kubelet updates the mounted files and
    the server's certificate watcher switches to them without a restart."""
    objects: list[dict[str, Any]] = []
    issuer = values["issuerRef"]
    if issuer is None:
        issuer = {"name": f"{SERVICE_NAME}-selfsigned", "kind": "Issuer"}
        objects.append(
            {
                "apiVersion": "cert-manager.io/v1",
                "kind": "Issuer",
                "metadata": {"name": issuer["name"], "namespace": namespace, "labels": dict(LABELS)},
                "spec": {"selfSigned": {}},
            }
        )
    service_dns = [f"{SERVICE_NAME}.{namespace}.svc", f"{SERVICE_NAME}.{namespace}.svc.cluster.local"]
    objects.append(
        {
            "apiVersion": "cert-manager.io/v1",
            "kind": "Certificate",
            "metadata": {"name": SERVICE_NAME, "namespace": namespace, "labels": dict(LABELS)},
            "spec": {
                "secretName": secret_name,
                "dnsNames": service_dns,
                "duration": str(values["duration"]),
                "renewBefore": str(values["renewBefore"]),
                "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
                "usages": ["digital signature", "server auth"],
                "issuerRef": {"name": issuer["name"], "kind": issuer.get("kind", "Issuer"), "group": "cert-manager.io"},
            },
        }
    )
    return objects


def service_monitor(namespace: str, secret_name: str) -> dict[str, Any]:
    """A Prometheus Operator ServiceMonitor for /metrics over HTTPS, verifying the serving
    certificate with the `ca.crt` of the TLS Secret (cert-manager writes it; otherwise add it)."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": SERVICE_NAME, "namespace": namespace, "labels": dict(LABELS)},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": SERVICE_NAME}},
            "namespaceSelector": {"matchNames": [namespace]},
            "endpoints": [
                {
                    "port": "metrics",  # the Service's port for the probes listener
                    "scheme": "https",
                    "path": "/metrics",
                    "interval": "30s",
                    "tlsConfig": {
                        "serverName": f"{SERVICE_NAME}.{namespace}.svc",
                        "ca": {"secret": {"name": secret_name, "key": "ca.crt"}},
                    },
                }
            ],
        },
    }
