"""`scheduling-webhook manifests`: render `manifests/` for one cluster from a values file.

Deliberately not a template engine. The YAML files in `manifests/` are complete, valid objects
for the default install (namespace `hopsworks`); rendering parses them and changes a known, short
list of fields per kind. Anything the values do not name stays exactly as written in the files,
so a reviewer reads the files to know what gets applied.

Where the files come from: `$SCHEDULING_WEBHOOK_MANIFESTS` when set, else `manifests/` next to
the `webhook` package (a source checkout or an editable install), else `./manifests`
(`webhook.manifest_files` reads and writes them). The wheel
does not carry them: rendering is an installer's job, done from the repository (or the
container image, which copies them and sets the variable).
"""

from __future__ import annotations

import argparse
import base64
import copy
import ipaddress
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from webhook.manifest_addons import SCRAPE_ANNOTATIONS, SERVICE_NAME, cert_manager_objects, service_monitor
from webhook.manifest_files import (
    RenderError,
    dump_all,
    load_base,
    load_values,
    manifests_dir,
    write_dir,
)
from webhook.settings import SETTINGS_CONFIGMAP, ClusterSettings, SettingsError

# The namespace the files in manifests/ are written for; the renderer swaps it out.
BASE_NAMESPACE = "hopsworks"
CONTAINER_NAME = "webhook"
RUNAI_SECRET_VOLUME = "runai-client-secret"
CERTS_VOLUME = "certs"
# System namespaces the pod webhooks never select, besides the install namespace.
SYSTEM_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")
NAMESPACE_LABEL = "kubernetes.io/metadata.name"
# What `scheduling-webhook certs` writes by default; used when the values name no CA.
LOCAL_CA = Path("certs/cluster/ca.crt")
CERT_MANAGER_INJECT = "cert-manager.io/inject-ca-from"
DEFAULT_TLS_SECRET = "scheduling-webhook-tls"
# G2: the identities allowed to change run_ai_enable reach the server as one comma-separated list
# (`group:NAME` for a group, otherwise a user name).
INSTALLERS_ENV = "SCHEDULING_WEBHOOK_INSTALLERS"

DEFAULT_VALUES: dict[str, Any] = {
    "namespace": BASE_NAMESPACE,
    "createNamespace": True,
    "image": None,
    "imagePullPolicy": None,
    "replicas": None,
    "resources": None,
    "priorityClassName": None,
    "caBundle": None,
    "caFile": None,
    "tlsSecretName": None,
    "clientCAKey": None,
    "installers": None,
    # cert-manager issues and renews the serving certificate, and its CA injector fills caBundle.
    "certManager": {"enabled": False, "issuerRef": None, "duration": "2160h", "renewBefore": "720h"},
    # Prometheus: prometheus.io/* annotations on the pods, and/or a ServiceMonitor (Prometheus Operator).
    "metrics": {"scrapeAnnotations": False, "serviceMonitor": False, "alertRules": False},
    "settings": {},
    "global": {},
    # Optional NetworkPolicy (manifests/optional/networkpolicy.yaml); see that file for why it is off.
    "networkPolicy": {"enabled": False, "apiserverCIDRs": [], "apiClients": None, "metricsNamespace": "monitoring"},
}
# In a subfolder: `kubectl apply -f manifests/` does not descend into it, so it stays off unless chosen.
NETWORK_POLICY_FILE = "optional/networkpolicy.yaml"
# With run_ai_enable: read access to Run:ai's admission Deployments (namespace runai).
RUNAI_ADMISSION_READER_FILE = "optional/runai-admission-reader.yaml"
# With metrics.alertRules: the Prometheus Operator's PrometheusRule (certificate expiry, Run:ai's admission).
ALERT_RULES_FILE = "optional/prometheusrule.yaml"


# -- entry points --------------------------------------------------------------------------------


def manifests_command(args: argparse.Namespace) -> int:
    """CLI: render with `args.values` (a path or None) to stdout or one file per object in `args.out`."""
    try:
        values: dict[str, Any] = {}
        if args.values:
            values = load_values(Path(args.values))
        cert_manager = (values.get("certManager") or {}).get("enabled") is True
        if not cert_manager and not values.get("caBundle") and not values.get("caFile") and LOCAL_CA.is_file():
            # What `scheduling-webhook certs` (and `make certs`) just made in this checkout.
            print(f"note: no caBundle or caFile in the values, using {LOCAL_CA}", file=sys.stderr)
            values["caFile"] = str(LOCAL_CA)
        objects = render(values)
    except RenderError as exc:
        print(f"scheduling-webhook manifests: refusing to render: {exc}", file=sys.stderr)
        return 1
    if args.out:
        written = write_dir(objects, Path(args.out))
        print(f"wrote {len(written)} files to {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(dump_all(objects))
    return 0


def render(values: Mapping[str, Any], source: Path | None = None) -> list[dict[str, Any]]:
    """Objects of `manifests/` (in apply order) with the values applied. Raises RenderError."""
    merged = _merge_values(values)
    namespace = _namespace(merged["namespace"])
    replicas = _replicas(merged["replicas"])
    base = load_base(source)
    settings_data = _settings_data(merged, base)
    cert_manager = _cert_manager(merged)
    ca_bundle = None if cert_manager else _ca_bundle(merged)
    metrics = _metrics(merged)
    tls_secret = str(merged["tlsSecretName"] or DEFAULT_TLS_SECRET)

    objects: list[dict[str, Any]] = []
    for obj in base:
        kind = obj.get("kind")
        if kind == "Namespace":
            if not merged["createNamespace"]:
                continue
            obj["metadata"]["name"] = namespace
        elif "namespace" in obj.get("metadata", {}):
            obj["metadata"]["namespace"] = namespace
        if kind in ("ClusterRoleBinding", "RoleBinding"):
            for subject in obj.get("subjects", []):
                if subject.get("kind") == "ServiceAccount":
                    subject["namespace"] = namespace
        elif kind == "ConfigMap" and obj["metadata"]["name"] == SETTINGS_CONFIGMAP:
            obj["data"] = settings_data
        elif kind == "Deployment":
            _apply_deployment(obj, merged, replicas, settings_data)
            if metrics["scrapeAnnotations"]:
                obj["spec"]["template"]["metadata"].setdefault("annotations", {}).update(SCRAPE_ANNOTATIONS)
        elif kind == "PodDisruptionBudget" and replicas is not None and replicas < 2:
            # minAvailable 1 over a single replica would block every node drain.
            print("note: replicas < 2, leaving out the PodDisruptionBudget", file=sys.stderr)
            continue
        elif kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            _apply_webhooks(obj, namespace, ca_bundle)
            if cert_manager:
                obj["metadata"].setdefault("annotations", {})[CERT_MANAGER_INJECT] = f"{namespace}/{SERVICE_NAME}"
        elif kind in ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"):
            _apply_policy(obj, namespace)
        objects.append(obj)
        if kind == "Service":
            # Right after the Service: the Secret must exist before the Deployment mounts it.
            if cert_manager:
                objects.extend(cert_manager_objects(namespace, tls_secret, cert_manager))
            if metrics["serviceMonitor"]:
                objects.append(service_monitor(namespace, tls_secret))
    if settings_data.get("run_ai_enable", "").strip().lower() == "true":
        # After our own RBAC, before the Deployment that uses it (the namespace is Run:ai's, not ours).
        reader = _optional_objects(RUNAI_ADMISSION_READER_FILE, source)
        for obj in reader:
            for subject in obj.get("subjects", []):
                subject["namespace"] = namespace
        at = next((i for i, o in enumerate(objects) if o["kind"] == "ConfigMap"), len(objects))
        objects[at:at] = reader
    if metrics["alertRules"]:
        for rule in _optional_objects(ALERT_RULES_FILE, source):
            rule["metadata"]["namespace"] = namespace
            objects.append(rule)
    policy = _network_policy(merged["networkPolicy"], namespace, source)
    if policy is not None:
        # Before the webhook configurations: the apiserver must be admitted before it is sent reviews.
        first_webhook = next(
            (i for i, o in enumerate(objects) if o["kind"].endswith("WebhookConfiguration")), len(objects)
        )
        objects.insert(first_webhook, policy)
    return objects


def _optional_objects(name: str, source: Path | None) -> list[dict[str, Any]]:
    path = (source or manifests_dir()) / name
    return [dict(o) for o in yaml.safe_load_all(path.read_text(encoding="utf-8")) if isinstance(o, dict)]


def _network_policy(values: Mapping[str, Any], namespace: str, source: Path | None) -> dict[str, Any] | None:
    unknown = sorted(set(values) - set(DEFAULT_VALUES["networkPolicy"]))
    if unknown:
        raise RenderError(f"networkPolicy: unknown keys {unknown}; known: {sorted(DEFAULT_VALUES['networkPolicy'])}")
    if not values.get("enabled"):
        return None
    cidrs = values.get("apiserverCIDRs") or []
    if not isinstance(cidrs, list) or not cidrs:
        raise RenderError(
            "networkPolicy.apiserverCIDRs: name the addresses the kube-apiserver connects from (e.g. the "
            "control-plane nodes' IPs as /32); without them the policy would refuse the apiserver and, the pod "
            "webhooks failing closed, every project pod"
        )
    for cidr in cidrs:
        try:
            ipaddress.ip_network(str(cidr), strict=False)
        except ValueError:
            raise RenderError(f"networkPolicy.apiserverCIDRs: {cidr!r} is not an address range") from None
    metrics_ns = values.get("metricsNamespace")
    if not isinstance(metrics_ns, str) or not metrics_ns:
        raise RenderError("networkPolicy.metricsNamespace: the namespace of the metrics scraper")
    path = (source or manifests_dir()) / NETWORK_POLICY_FILE
    policy = yaml.safe_load(path.read_text(encoding="utf-8"))
    policy["metadata"]["namespace"] = namespace
    apiserver, clients, scraper = policy["spec"]["ingress"]
    apiserver["from"] = [{"ipBlock": {"cidr": str(c)}} for c in cidrs]
    if values.get("apiClients") is not None:
        if not isinstance(values["apiClients"], list):
            raise RenderError("networkPolicy.apiClients: a list of NetworkPolicy peers")
        clients["from"] = copy.deepcopy(values["apiClients"])
    scraper["from"][0]["namespaceSelector"]["matchLabels"][NAMESPACE_LABEL] = metrics_ns
    return dict(policy)


# -- values --------------------------------------------------------------------------------------


def _merge_values(values: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(values) - set(DEFAULT_VALUES))
    if unknown:
        raise RenderError(f"unknown values {unknown}; known: {sorted(DEFAULT_VALUES)}")
    merged = copy.deepcopy(DEFAULT_VALUES)
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(merged[key], dict):
            if not isinstance(value, Mapping):
                raise RenderError(f"{key}: expected a mapping, got {type(value).__name__}")
            merged[key] = {**merged[key], **copy.deepcopy(dict(value))}
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def _namespace(value: Any) -> str:
    if not isinstance(value, str) or not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", value):
        raise RenderError(f"namespace: {value!r} is not a valid namespace name")
    if value in SYSTEM_NAMESPACES or value == "default":
        raise RenderError(f"namespace: {value!r} is a system namespace; install into a namespace of its own")
    return value


def _settings_data(merged: Mapping[str, Any], base: list[dict[str, Any]]) -> dict[str, str]:
    """The settings ConfigMap's data: the file's keys overwritten by `settings:`; checked (G1)."""
    configmap = next(
        (o for o in base if o.get("kind") == "ConfigMap" and o["metadata"]["name"] == SETTINGS_CONFIGMAP),
        None,
    )
    if configmap is None:
        raise RenderError(f"the manifests hold no ConfigMap {SETTINGS_CONFIGMAP}")
    data: dict[str, str] = dict(configmap.get("data") or {})
    overrides = merged["settings"]
    known = set(ClusterSettings.model_fields)
    unknown = sorted(set(overrides) - known)
    if unknown:
        # from_configmap_data ignores unknown keys; a typo such as run_ai_enabled must not pass.
        raise RenderError(f"settings: unknown keys {unknown}; known: {sorted(known)}")
    for key, value in overrides.items():
        data[key] = _configmap_string(key, value)
    try:
        settings = ClusterSettings.from_configmap_data(data)
    except SettingsError as exc:
        raise RenderError(f"settings: {exc}") from None
    error = settings.exclusion_error() or settings.runai_error()
    if error:
        raise RenderError(error)
    if settings.run_ai_enable and _helm_kueue_enabled(merged["global"]):
        raise RenderError(
            "global._hopsworks.kueue.enabled and run_ai_enable cannot both be true: "
            "a cluster uses Kueue, Run:ai, or neither"
        )
    if settings.run_ai_enable:
        missing = [
            key
            for key in ("run_ai_client_id", "run_ai_client_secret_name", "run_ai_client_secret_key")
            if not getattr(settings, key)
        ]
        if missing:
            raise RenderError(f"run_ai_enable is true but {', '.join(missing)} is empty")
    return data


def _helm_kueue_enabled(global_values: Any) -> bool:
    """The Hopsworks chart's Kueue switch, `global._hopsworks.kueue.enabled`, when the values carry it."""
    node: Any = global_values
    for key in ("_hopsworks", "kueue", "enabled"):
        if not isinstance(node, Mapping):
            return False
        node = node.get(key)
    return node is True or (isinstance(node, str) and node.strip().lower() == "true")


def _configmap_string(key: str, value: Any) -> str:
    if key == "scheduler" and isinstance(value, Mapping):
        return yaml.safe_dump(dict(value), sort_keys=False, default_flow_style=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return ""
    if isinstance(value, int | float | str):
        return str(value)
    raise RenderError(f"settings.{key}: expected a scalar, got {type(value).__name__}")


def _ca_bundle(merged: Mapping[str, Any]) -> str:
    """base64 of the PEM CA that signed the serving certificate, from caBundle or caFile.

    A relative caFile is read from the current directory, like any path given on a command line:
    `cp examples/values.example.yaml my-values.yaml` and rendering from the repository's root reads
    `certs/cluster/ca.crt` there, wherever the values file is kept.
    """
    bundle, ca_file = merged["caBundle"], merged["caFile"]
    if bundle and ca_file:
        raise RenderError("set caBundle or caFile, not both")
    if ca_file:
        path = Path(str(ca_file))
        try:
            pem = path.read_bytes()
        except OSError as exc:
            where = "" if path.is_absolute() else f" (relative to the current directory, {Path.cwd()})"
            raise RenderError(f"caFile: cannot read {ca_file}{where}: {exc.strerror}") from None
        bundle = base64.b64encode(pem).decode("ascii")
    if not bundle:
        raise RenderError(
            "no CA for the webhook configurations: set caBundle (base64 of ca.crt), caFile "
            "(e.g. certs/cluster/ca.crt from `scheduling-webhook certs`) or certManager.enabled; without "
            "it the apiserver cannot verify the webhook and, failing closed, refuses every project pod"
        )
    try:
        pem = base64.b64decode(str(bundle), validate=True)
    except ValueError:
        raise RenderError("caBundle is not valid base64") from None
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        raise RenderError("caBundle does not decode to a PEM certificate")
    return str(bundle)


def _replicas(value: Any) -> int | None:
    """None keeps the file's count."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise RenderError(f"replicas: expected a positive integer, got {value!r}")
    return value


# -- per-kind edits ------------------------------------------------------------------------------


def _apply_deployment(
    obj: dict[str, Any], merged: Mapping[str, Any], replicas: int | None, settings_data: Mapping[str, str]
) -> None:
    spec = obj["spec"]
    pod = spec["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == CONTAINER_NAME)

    if replicas is not None:
        spec["replicas"] = replicas
    for key in ("image", "imagePullPolicy"):
        if merged[key]:
            container[key] = str(merged[key])
    if merged["resources"]:
        if not isinstance(merged["resources"], Mapping):
            raise RenderError("resources: expected a mapping with requests/limits")
        container["resources"] = copy.deepcopy(dict(merged["resources"]))
    if merged["priorityClassName"]:
        pod["priorityClassName"] = str(merged["priorityClassName"])

    volumes = {v["name"]: v for v in pod["volumes"]}
    if merged["tlsSecretName"]:
        volumes[CERTS_VOLUME]["secret"]["secretName"] = str(merged["tlsSecretName"])
    if merged["clientCAKey"]:
        # The CA file sits in the same Secret; the server then requires the apiserver's client cert.
        mount = next(m for m in container["volumeMounts"] if m["name"] == CERTS_VOLUME)
        container["args"] += ["--client-ca", f"{mount['mountPath']}/{merged['clientCAKey']}"]

    # The Run:ai client secret volume follows the settings; with no Secret named, no volume.
    secret_name = settings_data.get("run_ai_client_secret_name", "")
    secret_key = settings_data.get("run_ai_client_secret_key", "")
    if secret_name and secret_key:
        runai = volumes[RUNAI_SECRET_VOLUME]["secret"]
        runai["secretName"] = secret_name
        runai["items"] = [{"key": secret_key, "path": secret_key}]
    else:
        pod["volumes"] = [v for v in pod["volumes"] if v["name"] != RUNAI_SECRET_VOLUME]
        container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != RUNAI_SECRET_VOLUME]

    installers = merged["installers"]
    if installers is not None:
        if not isinstance(installers, list) or not all(_identity_ok(n) for n in installers):
            raise RenderError("installers: expected a list of user names and group:NAME, without commas")
        env = next(e for e in container["env"] if e["name"] == INSTALLERS_ENV)
        env["value"] = ",".join(installers)


def _identity_ok(name: Any) -> bool:
    return isinstance(name, str) and bool(name.strip()) and "," not in name


def _apply_policy(obj: dict[str, Any], namespace: str) -> None:
    """The admission policies name this server's ServiceAccount and select the install namespace."""
    base_user, user = _service_account_user(BASE_NAMESPACE), _service_account_user(namespace)
    for condition in obj["spec"].get("matchConditions", []):
        condition["expression"] = condition["expression"].replace(f"'{base_user}'", f"'{user}'")
    selector = (obj["spec"].get("matchResources") or {}).get("namespaceSelector") or {}
    for expr in selector.get("matchExpressions", []):
        if expr.get("key") == NAMESPACE_LABEL:
            expr["values"] = [namespace if v == BASE_NAMESPACE else v for v in expr["values"]]


def _service_account_user(namespace: str) -> str:
    return f"system:serviceaccount:{namespace}:scheduling-webhook"


def _apply_webhooks(obj: dict[str, Any], namespace: str, ca_bundle: str | None) -> None:
    """`ca_bundle` None: left out, for cert-manager's CA injector to fill."""
    for hook in obj["webhooks"]:
        client = hook["clientConfig"]
        if ca_bundle is not None:
            client["caBundle"] = ca_bundle
        else:
            client.pop("caBundle", None)
        client["service"]["namespace"] = namespace
        for selector_key in ("namespaceSelector", "objectSelector"):
            for expr in (hook.get(selector_key) or {}).get("matchExpressions", []):
                if expr.get("key") == NAMESPACE_LABEL:
                    # The install namespace is excluded from (or, for settings, the only match of)
                    # the selectors; follow it to wherever it is installed.
                    expr["values"] = [namespace if v == BASE_NAMESPACE else v for v in expr["values"]]


# -- cert-manager and Prometheus -----------------------------------------------------------------


def _switches(merged: Mapping[str, Any], key: str) -> dict[str, Any]:
    known = set(DEFAULT_VALUES[key])
    unknown = sorted(set(merged[key]) - known)
    if unknown:
        raise RenderError(f"{key}: unknown keys {unknown}; known: {sorted(known)}")
    return dict(merged[key])


def _cert_manager(merged: Mapping[str, Any]) -> dict[str, Any] | None:
    """The certManager values when enabled, else None. With it, no caBundle or caFile."""
    values = _switches(merged, "certManager")
    if values["enabled"] is not True:
        return None
    if merged["caBundle"] or merged["caFile"]:
        raise RenderError("certManager.enabled: cert-manager injects the CA; leave caBundle and caFile out")
    issuer = values["issuerRef"]
    if issuer is not None and not (
        isinstance(issuer, Mapping)
        and issuer.get("name")
        and issuer.get("kind", "Issuer") in ("Issuer", "ClusterIssuer")
    ):
        raise RenderError("certManager.issuerRef: expected {name: ..., kind: Issuer|ClusterIssuer}")
    return values


def _metrics(merged: Mapping[str, Any]) -> dict[str, bool]:
    values = _switches(merged, "metrics")
    for key, value in values.items():
        if not isinstance(value, bool):
            raise RenderError(f"metrics.{key}: expected true or false, got {value!r}")
    return values
