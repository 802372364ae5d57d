"""The chart (manifests/chart) as the real helm renders it, the plain YAML made from it, and the Dockerfile.

Schemas come from kubernetes-validate in strict mode (unknown fields fail), at the oldest
Kubernetes the chart claims (1.30: matchConditions GA, the preStop sleep action) and the
newest the package ships (the real apiserver's own check is tests/e2e/test_install.py). The
selector checks evaluate the label selectors the way the apiserver
does, against namespaces labelled as an adversary might label them.
"""

from __future__ import annotations

import base64
import datetime
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tests.support import chart, policy_template, values_reference, webhook_conditions_template
from tests.support.chart import HelmFailed
from webhook.core.admission_policies import POLICY_NAME, REFUSAL_ANNOTATION, policy_objects
from webhook.core.preemptibility import REVIEWED_REFS
from webhook.core.workloads import WORKLOAD_KINDS
from webhook.settings import SETTINGS_CONFIGMAP, ClusterSettings

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "manifests"
EXAMPLE_VALUES = ROOT / "examples" / "values.example.yaml"
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
# Mutating configurations that read the labels ours adds, so ours must be called before them:
# Kueue's (plain and as a Helm subchart of a "hopsworks" release) and Run:ai's cluster webhooks.
LATER_MUTATORS = (
    "kueue-mutating-webhook-configuration",
    "hopsworks-kueue-mutating-webhook-configuration",
    "runai-fractional-gpus",
    "runai-label-project",
    "runai-mutating-webhook",
    "runai-node-affinity",
    "runai-admission-controller",
)
SERVER_PATHS = {
    "/mutate/pods",
    "/mutate/workloads",
    "/validate/pods",
    "/validate/workloads",
    "/validate/settings",
    "/validate/pod-updates",
}
CLUSTER_SCOPED = (
    "Namespace",
    "APIService",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "ValidatingWebhookConfiguration",
)
POD_HOOKS = (
    "mutate-pods.scheduling.hopsworks.ai",
    "validate-pods.scheduling.hopsworks.ai",
    "validate-workloads.scheduling.hopsworks.ai",
    "mutate-workloads.scheduling.hopsworks.ai",
    "validate-pod-updates.scheduling.hopsworks.ai",
)


# -- fixtures and helpers ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca_pem() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "manifests-test-ca")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


@pytest.fixture(scope="module")
def ca_bundle(ca_pem: bytes) -> str:
    return base64.b64encode(ca_pem).decode("ascii")


def given_ca(ca_bundle: str) -> dict[str, Any]:
    """certs.mode secret: the installer's own certificate, and its CA as the caBundle."""
    return {"certs": {"mode": "secret", "secret": {"caBundle": ca_bundle}}}


def render(
    values: Mapping[str, Any] | None = None, namespace: str = "hopsworks", api_versions: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The install's objects; the uninstall hook's (run by helm at uninstall only) are `hooks`."""
    return [o for o in chart.render(values, namespace, api_versions) if not is_hook(o)]


def hooks(values: Mapping[str, Any] | None = None, namespace: str = "hopsworks") -> list[dict[str, Any]]:
    return [o for o in chart.render(values, namespace) if is_hook(o)]


def is_hook(obj: Mapping[str, Any]) -> bool:
    return "helm.sh/hook" in (obj["metadata"].get("annotations") or {})


def refused(values: Mapping[str, Any], message: str, namespace: str = "hopsworks") -> str:
    """helm refuses these values with `message` (the schema's or the chart's) and renders nothing."""
    with pytest.raises(HelmFailed) as failed:
        chart.template(values, namespace)
    assert message in failed.value.stderr, failed.value.stderr
    return failed.value.stderr


@pytest.fixture
def example_values(ca_bundle: str) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(EXAMPLE_VALUES.read_text())
    return {**values, **given_ca(ca_bundle)}


@pytest.fixture
def rendered(ca_bundle: str) -> list[dict[str, Any]]:
    return render(given_ca(ca_bundle))


def file_objects() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                out.append((path.name, doc))
    return out


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


DECIDED_CONFIGURATIONS = ("0-hopsworks-scheduling-webhook-policies", "hopsworks-scheduling-webhook-policies")


def webhooks(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every webhook by name, from the main configurations: the pod webhooks for the namespaces
    the compiled admission policies decide have the same names, in configurations of their own
    (`decided_hooks`)."""
    hooks = {}
    for obj in objects:
        if obj["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            if obj["metadata"]["name"] in DECIDED_CONFIGURATIONS:
                continue
            for hook in obj["webhooks"]:
                hooks[hook["name"]] = {**hook, "_configuration": obj}
    return hooks


def decided_hooks(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {
        hook["name"]: hook
        for obj in objects
        if obj["kind"].endswith("WebhookConfiguration") and obj["metadata"]["name"] in DECIDED_CONFIGURATIONS
        for hook in obj["webhooks"]
    }


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """metav1.LabelSelector semantics; a missing selector matches everything."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def namespace_labels(name: str, project: bool = True) -> dict[str, str]:
    labels = {"kubernetes.io/metadata.name": name}
    if project:
        labels["hopsworks.ai/project"] = name
    return labels


def hook_reaches(hook: Mapping[str, Any], namespace: str, project: bool = True) -> bool:
    """Would the apiserver call this webhook for an object in (or, cluster-scoped, being) `namespace`?"""
    labels = namespace_labels(namespace, project)
    scopes = {rule.get("scope", "*") for rule in hook["rules"]}
    if scopes == {"Cluster"}:
        return selector_matches(hook.get("objectSelector"), labels)
    return selector_matches(hook.get("namespaceSelector"), labels)


def strings(node: Any, path: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from strings(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from strings(value, f"{path}[{index}]")
    elif isinstance(node, str):
        yield path, node


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    return next(c for c in pod["containers"] if c["name"] == "webhook")


def env_value(c: Mapping[str, Any], name: str) -> Any:
    entry = next(e for e in c["env"] if e["name"] == name)
    return entry.get("value", entry.get("valueFrom"))


# -- schema ---------------------------------------------------------------------------------------


def _object_id(value: Any) -> str:
    return value if isinstance(value, str) else value["kind"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(("filename", "obj"), file_objects(), ids=_object_id)
def test_every_manifest_file_passes_the_schema(filename: str, obj: dict[str, Any], version: str) -> None:
    kubernetes_validate.validate(obj, version, strict=True)


def test_the_manifest_files_hold_the_expected_objects_in_apply_order() -> None:
    kinds = [obj["kind"] for _, obj in file_objects()]
    assert kinds[0] == "Namespace"
    # Webhook configurations last: they point at a Service that must exist first.
    # One of each: the second pair, for the namespaces the compiled admission policies decide, is
    # rendered only beside the policies, which `kubectl apply` users do not get (no --api-versions).
    assert kinds[-2:] == ["ValidatingWebhookConfiguration", "MutatingWebhookConfiguration"]
    for kind in ("ServiceAccount", "ClusterRole", "Role", "ConfigMap", "Service", "Deployment"):
        assert kind in kinds
    assert kinds.index("ServiceAccount") < kinds.index("Deployment")
    assert "PodDisruptionBudget" in kinds


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_object_passes_the_schema(example_values: dict[str, Any], version: str) -> None:
    values = {**example_values, "createNamespace": True, "certs": {**example_values["certs"], "clientCAKey": "ca.crt"}}
    objects = render(values, "platform")
    assert {o["kind"] for o in objects} >= {o["kind"] for _, o in file_objects()}
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_the_example_values_pass_the_schema_and_lint(example_values: dict[str, Any]) -> None:
    # As manifests/README.md has it: the example copied and edited, given with -f.
    out = chart.helm("lint", str(chart.CHART), "--strict", "--namespace", "hopsworks", values=example_values)
    assert "0 chart(s) failed" in out, out
    docs = render(yaml.safe_load(EXAMPLE_VALUES.read_text()))
    settings = ClusterSettings.from_configmap_data(one(docs, "ConfigMap", SETTINGS_CONFIGMAP)["data"])
    assert settings.scheduler.defaults.priority_class == "hopsworks-normal"


def test_certs_mode_helm_issues_a_ca_and_a_serving_certificate_for_the_service() -> None:
    objects = render({}, "platform")
    secrets = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Secret"}
    ca_pem = base64.b64decode(secrets["scheduling-webhook-tls-ca"]["data"]["tls.crt"])
    serving = secrets["scheduling-webhook-tls"]["data"]
    ca = x509.load_pem_x509_certificate(ca_pem)
    cert = x509.load_pem_x509_certificate(base64.b64decode(serving["tls.crt"]))
    assert base64.b64decode(serving["ca.crt"]) == ca_pem
    assert cert.issuer == ca.subject
    ca.public_key().verify(cert.signature, cert.tbs_certificate_bytes, *_verify_args(cert))  # type: ignore[call-arg, arg-type]
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "scheduling-webhook.platform.svc" in names
    for hook in webhooks(objects).values():
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == ca_pem, hook["name"]
    # The pods mount the serving pair only: the CA's key is in a Secret of its own.
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    mounted = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert "scheduling-webhook-tls" in mounted and "scheduling-webhook-tls-ca" not in mounted


def _verify_args(cert: x509.Certificate) -> tuple[Any, ...]:
    from cryptography.hazmat.primitives.asymmetric import padding

    return (padding.PKCS1v15(), cert.signature_hash_algorithm)


def test_manifests_folder_holds_only_kubernetes_objects() -> None:
    """`kubectl apply -f manifests/` reads every .yaml/.yml/.json there: each must be an object."""
    for path in sorted(MANIFESTS.iterdir()):
        if path.suffix in (".yaml", ".yml", ".json"):
            for doc in yaml.safe_load_all(path.read_text()):
                assert doc is None or ("apiVersion" in doc and "kind" in doc), path


def test_raw_webhook_configurations_carry_no_placeholder_ca() -> None:
    for _, obj in file_objects():
        for hook in obj.get("webhooks", ()):
            assert "caBundle" not in hook["clientConfig"], hook["name"]
    readme = (MANIFESTS / "README.md").read_text()
    assert "valid as it stands" not in readme and "no caBundle" in readme


def test_example_priority_classes_are_shipped() -> None:
    values = yaml.safe_load(EXAMPLE_VALUES.read_text())
    named = set(values["variables"]["scheduler"]["available"]["priorityClasses"])
    shipped = list(yaml.safe_load_all((ROOT / "examples" / "priorityclasses.yaml").read_text()))
    for obj in shipped:
        kubernetes_validate.validate(obj, K8S_VERSIONS[0], strict=True)
    assert named == {obj["metadata"]["name"] for obj in shipped}
    assert "examples/priorityclasses.yaml" in (MANIFESTS / "README.md").read_text()


def test_cert_manager_mode_issues_the_secret_and_injects_the_ca() -> None:
    objects = render({"certs": {"mode": "certManager"}}, "platform")
    kinds = [o["kind"] for o in objects]
    assert {"Issuer", "Certificate"} <= set(kinds) and "Secret" not in kinds
    certificate = next(o for o in objects if o["kind"] == "Certificate")
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    mounted = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "certs")
    assert certificate["spec"]["secretName"] == mounted["secret"]["secretName"]
    assert "scheduling-webhook.platform.svc" in certificate["spec"]["dnsNames"]
    assert certificate["spec"]["issuerRef"]["name"] == "scheduling-webhook-selfsigned"
    for config in (o for o in objects if o["kind"].endswith("WebhookConfiguration")):
        assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "platform/scheduling-webhook"
        assert all("caBundle" not in hook["clientConfig"] for hook in config["webhooks"])
        kubernetes_validate.validate(config, K8S_VERSIONS[0], strict=True)


def test_cert_manager_with_an_issuer_of_the_cluster_and_refusals(ca_bundle: str) -> None:
    issuer = {"kind": "ClusterIssuer", "name": "corp-ca"}
    objects = render({"certs": {"mode": "certManager", "certManager": {"issuerRef": issuer}}})
    assert "Issuer" not in [o["kind"] for o in objects]
    certificate = next(o for o in objects if o["kind"] == "Certificate")
    assert certificate["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    refused({"certs": {"mode": "certManager", "secret": {"caBundle": ca_bundle}}}, "cert-manager injects the CA")
    refused({"certs": {"mode": "certManager", "certManager": {"enable": True}}},
            "at '/certs/certManager': additional properties 'enable' not allowed")  # fmt: skip


def test_metrics_switches_add_scrape_annotations_a_service_monitor_and_alert_rules(ca_bundle: str) -> None:
    plain = render(given_ca(ca_bundle))
    assert not {"ServiceMonitor", "PrometheusRule"} & {o["kind"] for o in plain}
    monitor_values = {"enabled": True, "labels": {"release": "prometheus"}, "interval": "15s"}
    metrics = {"scrapeAnnotations": True, "serviceMonitor": monitor_values, "alertRules": True}
    objects = render({**given_ca(ca_bundle), "metrics": metrics}, "platform")
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/scheme"] == "https"
    kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)
    monitor = next(o for o in objects if o["kind"] == "ServiceMonitor")
    endpoint = monitor["spec"]["endpoints"][0]
    service = next(o for o in objects if o["kind"] == "Service")
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["tlsConfig"]["serverName"] == "scheduling-webhook.platform.svc"
    # What the operator's Prometheus selects ServiceMonitors by, and how often it scrapes.
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    assert monitor["metadata"]["labels"]["app.kubernetes.io/name"] == "scheduling-webhook"
    assert endpoint["interval"] == "15s"
    rule = one(objects, "PrometheusRule")
    summaries = [r["annotations"]["summary"] for g in rule["spec"]["groups"] for r in g["rules"]]
    assert any("{{ $labels.deployment }}" in s for s in summaries), summaries  # Prometheus's template, not helm's
    refused({"metrics": {"serviceMonitor": {"enabled": "yes"}}}, "/metrics/serviceMonitor/enabled")
    refused({"metrics": {"serviceMonitor": {"interval": "often"}}}, "/metrics/serviceMonitor/interval")
    refused(
        {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"app.kubernetes.io/name": "x"}}}},
        "metrics.serviceMonitor.labels.app.kubernetes.io/name is a label the chart sets itself",
    )


# -- refusals ----------------------------------------------------------------------------------

CONFLICT = "Kueue and Run:ai cannot both be on"


@pytest.mark.parametrize(
    "values",
    [
        {"variables": {"kueue_installed": True, "run_ai_enable": True, "run_ai_client_id": "hw"}},
        {
            "variables": {"run_ai_enable": True, "run_ai_client_id": "hw"},
            "global": {"_hopsworks": {"kueue": {"enabled": True}}, "other": "the umbrella's"},
        },
    ],
    ids=["kueue_installed", "global-kueue"],
)
def test_helm_refuses_kueue_and_runai_both_on(values: dict[str, Any]) -> None:
    message = refused(values, CONFLICT)
    assert "variables.run_ai_enable" in message and "global._hopsworks.kueue.enabled" in message


def test_either_one_alone_renders() -> None:
    kueue = render({"global": {"_hopsworks": {"kueue": {"enabled": True}}}})
    assert one(kueue, "ConfigMap", SETTINGS_CONFIGMAP)["data"]["kueue_installed"] == "true"
    runai = render({"variables": {"run_ai_enable": True, "run_ai_client_id": "hw"},
                    "global": {"_hopsworks": {"kueue": {"enabled": False}}}})  # fmt: skip
    assert one(runai, "ConfigMap", SETTINGS_CONFIGMAP)["data"]["run_ai_enable"] == "true"
    reader = [o for o in runai if o["metadata"].get("namespace") == "runai"]
    assert sorted(o["kind"] for o in reader) == ["Role", "RoleBinding"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"namespaec": "x"}, "at '': additional properties 'namespaec' not allowed"),
        (
            {"variables": {"run_ai_enabled": True}},
            "at '/variables': additional properties 'run_ai_enabled' not allowed",
        ),
        ({"variables": {"run_ai_enable": "true"}}, "at '/variables/run_ai_enable': got string, want boolean"),
        ({"variables": {"run_ai_project_gpu_quota": -1}}, "at '/variables/run_ai_project_gpu_quota': minimum"),
        (
            {"variables": {"run_ai_default_department": "Data_Science"}},
            "at '/variables/run_ai_default_department': 'Data_Science' does not match pattern",
        ),
        ({"variables": {"run_ai_default_department": "d" * 64}}, "at '/variables/run_ai_default_department'"),
        (
            {"variables": {"run_ai_enable": True, "run_ai_client_id": ""}},
            "variables.run_ai_enable is true but variables.run_ai_client_id is empty",
        ),
        ({"replicas": 0}, "at '/replicas': minimum"),
        ({"installers": "group:system:masters"}, "at '/installers': got string, want array"),
        ({"certs": {"mode": "secret", "secret": {"caBundle": "not base64!"}}}, "at '/certs/secret/caBundle'"),
        (
            {"global": {"_hopsworks": {"kueue": {"enabled": "yes"}}}},
            "at '/global/_hopsworks/kueue/enabled': got string, want boolean",
        ),
    ],
)
def test_helm_refuses_bad_values_naming_the_value(values: dict[str, Any], message: str) -> None:
    refused(values, message)


@pytest.mark.parametrize("namespace", ["kube-system", "default"])
def test_helm_refuses_a_system_namespace(namespace: str) -> None:
    refused({}, f"the release namespace {namespace!r} is a system namespace".replace("'", '"'), namespace)


# -- webhook configurations ----------------------------------------------------------------------


def test_mutating_configuration_is_called_before_kueue_and_runai(rendered: list[dict[str, Any]]) -> None:
    mutating = one(rendered, "MutatingWebhookConfiguration", "0-hopsworks-scheduling-webhook")
    # The apiserver calls mutating configurations in order of name (byte order).
    ordered = sorted([mutating["metadata"]["name"], *LATER_MUTATORS])
    assert ordered[0] == mutating["metadata"]["name"]
    for hook in mutating["webhooks"]:
        assert hook["reinvocationPolicy"] == "IfNeeded"


def test_webhook_names_sort_before_runai(rendered: list[dict[str, Any]]) -> None:
    # S5: our mutating webhook binds a project before Run:ai's webhooks (runai-*) see its pods.
    # Configurations run in name order; the webhook names are checked too, so that a rename (or a
    # merge into one configuration with Run:ai's hooks, where the order is the list's) cannot slip
    # ours behind Run:ai's. Validating webhooks run in parallel, so only their configuration's
    # name is held to this.
    configurations = [o for o in rendered if o["kind"].endswith("WebhookConfiguration")]
    assert {o["kind"] for o in configurations} == {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    names = [o["metadata"]["name"] for o in configurations]
    names += [
        h["name"] for h in one(rendered, "MutatingWebhookConfiguration", "0-hopsworks-scheduling-webhook")["webhooks"]
    ]
    for name in names:
        assert name < "runai-", f"{name!r} sorts after Run:ai's webhooks (runai-*)"


def test_every_webhook_is_v1_short_and_explicit(rendered: list[dict[str, Any]], ca_bundle: str) -> None:
    service = one(rendered, "Service")
    hooks = webhooks(rendered)
    assert set(hooks) == {
        *POD_HOOKS,
        "validate-settings.scheduling.hopsworks.ai",
        "validate-namespaces.scheduling.hopsworks.ai",
    }
    for name, hook in hooks.items():
        assert hook["admissionReviewVersions"] == ["v1"], name
        assert hook["matchPolicy"] == "Equivalent", name
        assert 1 <= hook["timeoutSeconds"] <= 10, name
        assert hook["failurePolicy"] in ("Fail", "Ignore"), name
        ref = hook["clientConfig"]["service"]
        assert ref["name"] == service["metadata"]["name"], name
        assert ref["namespace"] == service["metadata"]["namespace"], name
        # The Service's `admission` port, apart from the console's and the APIs' 443.
        ports = {p["name"]: p for p in service["spec"]["ports"]}
        assert ref["port"] == ports["admission"]["port"] == 9443, name
        assert ports["admission"]["targetPort"] == "admission", name
        assert ref["path"] in SERVER_PATHS, name
        assert hook["clientConfig"]["caBundle"] == ca_bundle, name


def test_side_effects_as_designed(rendered: list[dict[str, Any]]) -> None:
    hooks = webhooks(rendered)
    # validate-pods reserves GPUs and mutate-pods may bind the namespace; nothing else writes.
    writers = {"validate-pods.scheduling.hopsworks.ai", "mutate-pods.scheduling.hopsworks.ai"}
    for name in writers:
        assert hooks[name]["sideEffects"] == "NoneOnDryRun", name
    for name in set(hooks) - writers:
        assert hooks[name]["sideEffects"] == "None", name


def test_quota_and_scheduling_fail_closed(rendered: list[dict[str, Any]]) -> None:
    hooks = webhooks(rendered)
    assert hooks["mutate-pods.scheduling.hopsworks.ai"]["failurePolicy"] == "Fail"
    assert hooks["validate-pods.scheduling.hopsworks.ai"]["failurePolicy"] == "Fail"
    assert hooks["validate-settings.scheduling.hopsworks.ai"]["failurePolicy"] == "Fail"
    # A Job let through without its queue label would run outside Kueue's quota.
    assert hooks["mutate-workloads.scheduling.hopsworks.ai"]["failurePolicy"] == "Fail"
    # An outage must not be the moment a pod's queue or preemptibility can be changed.
    assert hooks["validate-pod-updates.scheduling.hopsworks.ai"]["failurePolicy"] == "Fail"


@pytest.mark.parametrize("install_namespace", ["hopsworks", "platform"])
def test_pod_webhooks_reach_project_namespaces_only(install_namespace: str, ca_bundle: str) -> None:
    hooks = webhooks(render(given_ca(ca_bundle), install_namespace))
    for name in POD_HOOKS:
        hook = hooks[name]
        assert hook_reaches(hook, "team-a"), name
        assert not hook_reaches(hook, "team-b", project=False), name
        # Even if someone labels them as projects, these are never sent to us.
        for excluded in ("kube-system", "kube-public", "kube-node-lease", install_namespace):
            assert not hook_reaches(hook, excluded), f"{name} reaches {excluded}"


@pytest.mark.parametrize("install_namespace", ["hopsworks", "platform"])
def test_settings_webhook_reaches_only_the_install_namespace(install_namespace: str, ca_bundle: str) -> None:
    hook = webhooks(render(given_ca(ca_bundle), install_namespace))["validate-settings.scheduling.hopsworks.ai"]
    assert hook["rules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE", "DELETE"],
            "resources": ["configmaps"],
            "scope": "Namespaced",
        }
    ]
    assert hook_reaches(hook, install_namespace, project=False)
    for other in ("kube-system", "team-a", "hopsworks" if install_namespace != "hopsworks" else "other"):
        assert not hook_reaches(hook, other), other
    expressions = " ".join(c["expression"] for c in hook["matchConditions"])
    assert f"'{SETTINGS_CONFIGMAP}'" in expressions
    assert "namespace-controller" in expressions
    # An installer's DELETE is not sent (tests/test_chart_settings_webhook.py shows it on the apiserver).
    skip = {c["name"]: c["expression"] for c in hook["matchConditions"]}["not-an-installers-delete"]
    assert "request.operation == 'DELETE'" in skip and '["system:masters"]' in skip


def test_namespace_webhook_selects_project_namespaces_by_object(rendered: list[dict[str, Any]]) -> None:
    hook = webhooks(rendered)["validate-namespaces.scheduling.hopsworks.ai"]
    assert hook["rules"][0]["resources"] == ["namespaces"]
    assert hook["rules"][0]["scope"] == "Cluster"
    assert "namespaceSelector" not in hook  # ignored for cluster-scoped resources
    assert hook_reaches(hook, "team-a")
    assert not hook_reaches(hook, "team-b", project=False)
    assert not hook_reaches(hook, "kube-system")
    assert not hook_reaches(hook, "hopsworks")


def test_pod_update_webhook_sees_only_label_and_annotation_edits_of_pods(rendered: list[dict[str, Any]]) -> None:
    hook = webhooks(rendered)["validate-pod-updates.scheduling.hopsworks.ai"]
    # The pod itself only: status and binding (the kubelet's and the scheduler's) are subresources.
    assert hook["rules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"],
         "scope": "Namespaced"}
    ]  # fmt: skip
    assert "objectSelector" not in hook  # a guarded key may be added to a pod without any
    (condition,) = hook["matchConditions"]
    for part in ("labels", "annotations"):
        assert f"object.metadata.{part} != oldObject.metadata.{part}" in condition["expression"]
        assert f"has(object.metadata.{part}) != has(oldObject.metadata.{part})" in condition["expression"]


def test_workload_webhook_covers_pod_owners(rendered: list[dict[str, Any]]) -> None:
    hook = webhooks(rendered)["validate-workloads.scheduling.hopsworks.ai"]
    covered = {(g, r) for rule in hook["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    # Every kind of Kubernetes' own whose labels reach a pod's PodGroup, as the check reads them.
    assert {(group, plural) for (group, _), plural in WORKLOAD_KINDS.items()} <= covered
    # The quota promise depends on the owners' labels: an outage must not let one in.
    assert hook["failurePolicy"] == "Fail"
    assert [c["expression"] for c in hook["matchConditions"]] == ["!has(object.metadata.deletionTimestamp)"]
    for rule in hook["rules"]:
        # A scale has no template: only its UPDATE can change what a Kueue pod group holds.
        scale = rule["resources"] == ["deployments/scale"]
        assert set(rule["operations"]) == ({"UPDATE"} if scale else {"CREATE", "UPDATE"}), rule


# -- Deployment, Service, PDB ------------------------------------------------------------------------


def test_deployment_is_hardened_and_highly_available(rendered: list[dict[str, Any]]) -> None:
    deployment = one(rendered, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    c = container(rendered)
    assert deployment["spec"]["replicas"] == 2
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "add" not in sc["capabilities"]
    assert sc.get("privileged") is not True
    assert sc["runAsUser"] == pod["securityContext"]["runAsUser"]
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]

    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz"), ("startupProbe", "/readyz")):
        get = c[probe]["httpGet"]
        assert (get["path"], get["scheme"]) == (path, "HTTPS")
        assert get["port"] == "probes"  # the probe port: no client certificate asked, a cap of its own
    # The first lists of a large cluster take minutes; liveness must not cut them short.
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    # Yet a replica that has listed is found soon: the period adds to every restart's time to ready.
    assert startup["periodSeconds"] <= 2 and startup["timeoutSeconds"] <= startup["periodSeconds"]
    assert startup["httpGet"]["port"] == "probes"

    spread = pod.get("topologySpreadConstraints") or []
    anti = (pod.get("affinity") or {}).get("podAntiAffinity")
    assert anti or any(t["topologyKey"] == "kubernetes.io/hostname" and t["maxSkew"] == 1 for t in spread), (
        "replicas are not spread across nodes"
    )
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for t in spread:
        assert selector_matches(t["labelSelector"], labels)

    # Draining: a preStop delay inside the grace period.
    assert c["lifecycle"]["preStop"]["sleep"]["seconds"] < pod["terminationGracePeriodSeconds"]


def test_deployment_runs_serve_with_mounted_certs_and_namespace(rendered: list[dict[str, Any]]) -> None:
    pod = one(rendered, "Deployment")["spec"]["template"]["spec"]
    c = container(rendered)
    args = c["args"]
    assert args[0] == "serve"
    flags = dict(zip(args[1::2], args[2::2], strict=True))
    assert flags["--namespace"] == "$(POD_NAMESPACE)"
    assert env_value(c, "POD_NAMESPACE") == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    certs = volumes[mounts[flags["--certs"]]["name"]]
    assert certs["secret"]["secretName"]
    runai = volumes[mounts[flags["--runai-secret-dir"]]["name"]]
    assert runai["secret"]["optional"] is True
    assert volumes[mounts["/tmp"]["name"]]["emptyDir"] is not None
    assert c["ports"][0]["containerPort"] == int(flags["--port"])


def test_service_and_pdb_select_the_webhook_pods(rendered: list[dict[str, Any]]) -> None:
    labels = one(rendered, "Deployment")["spec"]["template"]["metadata"]["labels"]
    service = one(rendered, "Service")
    assert selector_matches({"matchLabels": service["spec"]["selector"]}, labels)
    port = service["spec"]["ports"][0]
    named = {p["name"]: p["containerPort"] for p in container(rendered)["ports"]}
    assert port["port"] == 443 and named[port["targetPort"]] == 8443
    pdb = one(rendered, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert selector_matches(pdb["spec"]["selector"], labels)


def test_single_replica_drops_the_pdb(ca_bundle: str) -> None:
    objects = render({**given_ca(ca_bundle), "replicas": 1})
    assert one(objects, "Deployment")["spec"]["replicas"] == 1
    assert not [o for o in objects if o["kind"] == "PodDisruptionBudget"]


# -- RBAC ----------------------------------------------------------------------------------------


def rules_of(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [rule for o in objects if o["kind"] == kind for rule in o["rules"]]


def allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str, name: str = "") -> bool:
    for rule in rules:
        if group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]:
            names = rule.get("resourceNames")
            if not names or name in names:
                return True
    return False


def test_rbac_has_no_wildcards_and_no_secrets(rendered: list[dict[str, Any]]) -> None:
    for kind in ("ClusterRole", "Role"):
        for rule in rules_of(rendered, kind):
            for field in ("apiGroups", "resources", "verbs"):
                assert "*" not in rule[field], (kind, rule)
            assert "secrets" not in rule["resources"], "the secrets arrive as mounted files"
            assert not {"escalate", "bind", "impersonate", "deletecollection"} & set(rule["verbs"])
            # The only deletes: the install namespace's own GPU reservation ConfigMaps (swept by the
            # leader once their namespace is gone), and cluster-wide only the compiled admission
            # policies' parameters, by their name. The admin ClusterRole for users deletes
            # departments of the aggregated API, which is a department delete, not an object's.
            if "delete" in rule["verbs"] and rule["apiGroups"] != ["scheduling.hopsworks.ai"]:
                assert (kind, rule["resources"]) == ("Role", ["configmaps"]) or (
                    kind == "ClusterRole" and rule.get("resourceNames") == ["scheduling-webhook-policy"]
                ), rule
            assert not rule.get("nonResourceURLs")


def test_rbac_grants_what_the_server_needs(rendered: list[dict[str, Any]]) -> None:
    cluster = rules_of(rendered, "ClusterRole")
    for group, resource in (
        ("", "namespaces"),
        ("", "pods"),
        ("scheduling.k8s.io", "priorityclasses"),
        ("kueue.x-k8s.io", "localqueues"),
        ("kueue.x-k8s.io", "clusterqueues"),
        ("kueue.x-k8s.io", "resourceflavors"),
        ("kueue.x-k8s.io", "topologies"),
        ("apps", "replicasets"),
    ):
        for verb in ("list", "watch"):
            assert allows(cluster, group, resource, verb), (resource, verb)
    assert allows(cluster, "", "namespaces", "patch") and not allows(cluster, "", "namespaces", "update")
    assert not allows(cluster, "", "namespaces", "create")
    assert not allows(cluster, "", "pods", "create")
    # Events about namespaces live in `default`: granted there, and nowhere else.
    assert not allows(cluster, "", "events", "create")
    (events,) = [o for o in rendered if o["kind"] == "Role" and o["metadata"]["namespace"] == "default"]
    assert events["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    assert allows(cluster, "authentication.k8s.io", "tokenreviews", "create")
    assert allows(cluster, "authorization.k8s.io", "subjectaccessreviews", "create")
    # The compiled admission policies: their parameter ConfigMaps by name only; the policies and
    # bindings (the chart's) read by name, never written, and no ConfigMap read beyond the
    # parameters (the apiserver would ask it of a writer of policies with ConfigMap parameters).
    for verb in ("create", "patch", "delete", "list", "watch", "get"):
        assert allows(cluster, "", "configmaps", verb, "scheduling-webhook-policy"), verb
        assert not allows(cluster, "", "configmaps", verb, "settings"), verb
    for resource in ("mutatingadmissionpolicies", "mutatingadmissionpolicybindings",
                     "validatingadmissionpolicies", "validatingadmissionpolicybindings"):  # fmt: skip
        assert allows(cluster, "admissionregistration.k8s.io", resource, "get", "scheduling-webhook-pods")
        assert not allows(cluster, "admissionregistration.k8s.io", resource, "get", "another-policy")
        for verb in ("create", "patch", "update", "delete"):
            assert not allows(cluster, "admissionregistration.k8s.io", resource, verb, "scheduling-webhook-pods")

    role = [r for o in rendered if o["kind"] == "Role" and o["metadata"]["namespace"] != "default" for r in o["rules"]]
    lease = env_value(container(rendered), "SCHEDULING_WEBHOOK_LEASE_NAME")
    assert allows(role, "coordination.k8s.io", "leases", "update", lease)
    assert allows(role, "coordination.k8s.io", "leases", "get", lease)
    assert not allows(role, "coordination.k8s.io", "leases", "update", "someone-elses-lease")
    assert allows(role, "", "configmaps", "watch") and allows(role, "", "configmaps", "update")


@pytest.mark.parametrize("install_namespace", ["hopsworks", "platform"])
def test_rbac_binds_the_install_namespaces_account(install_namespace: str, ca_bundle: str) -> None:
    objects = render(given_ca(ca_bundle), install_namespace)
    account = one(objects, "ServiceAccount")["metadata"]
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account["name"]
    # The ClusterRoles for the aggregated API's users are bound by the platform, not here.
    users = {"hopsworks:scheduling-webhook:project-member", "hopsworks:scheduling-webhook:admin"}
    # The apiserver's bootstrap Role that reads the front-proxy CA, bound in kube-system.
    bootstrap = {("kube-system", "extension-apiserver-authentication-reader")}
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        roles = {(o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects
                 if o["kind"] == role_kind and o["metadata"]["name"] not in users}  # fmt: skip
        roles |= bootstrap if kind == "RoleBinding" else set()
        bindings = [o for o in objects if o["kind"] == kind]
        assert len(bindings) == len(roles)
        for binding in bindings:
            assert (binding["metadata"].get("namespace"), binding["roleRef"]["name"]) in roles
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": account["name"], "namespace": install_namespace}
            ]
    # The install namespace's Role, and the one for Events about namespaces, which live in `default`.
    assert sorted(o["metadata"]["namespace"] for o in objects if o["kind"] == "Role") == sorted(
        [install_namespace, "default"]
    )


# -- values substitution -----------------------------------------------------------------------------


def test_namespace_follows_the_values_everywhere(ca_bundle: str) -> None:
    objects = render({**given_ca(ca_bundle), "createNamespace": True}, "platform")
    assert one(objects, "Namespace")["metadata"]["name"] == "platform"
    for obj in objects:
        if obj["kind"] not in CLUSTER_SCOPED:
            # Events about namespaces are accepted only in `default`: their grant is there. The
            # front-proxy CA the aggregated API needs is read in kube-system.
            events_grant = obj["metadata"]["name"] == "hopsworks:scheduling-webhook-events"
            ca_reader = obj["metadata"]["name"] == "hopsworks:scheduling-webhook:authentication-reader"
            expected = "default" if events_grant else "kube-system" if ca_reader else "platform"
            assert obj["metadata"]["namespace"] == expected, obj["kind"]
        for path, value in strings(obj):
            # "hopsworks" as a whole value can only be the old namespace (label values aside:
            # part-of names the platform).
            if value == "hopsworks":
                assert ".labels." in path, f"{obj['kind']}{path} still says hopsworks"
    for hook in webhooks(objects).values():
        assert hook["clientConfig"]["service"]["namespace"] == "platform"


def test_create_namespace_false_leaves_it_out(ca_bundle: str) -> None:
    objects = render({**given_ca(ca_bundle), "createNamespace": False})
    assert not [o for o in objects if o["kind"] == "Namespace"]


def test_settings_values_reach_the_configmap(example_values: dict[str, Any]) -> None:
    values = {
        **example_values,
        "variables": {
            **example_values["variables"],
            "run_ai_enable": True,
            "run_ai_client_id": "hopsworks-sa",
            "run_ai_project_gpu_quota": 1.5,
        },
    }
    configmap = one(render(values), "ConfigMap", SETTINGS_CONFIGMAP)
    data = configmap["data"]
    assert all(isinstance(v, str) for v in data.values())
    assert data["run_ai_enable"] == "true"
    settings = ClusterSettings.from_configmap_data(data)
    assert settings.run_ai_enable and settings.run_ai_client_id == "hopsworks-sa"
    assert settings.run_ai_project_gpu_quota == 1.5
    assert settings.scheduler.defaults.priority_class == "hopsworks-normal"
    assert "hopsworks-high" in settings.scheduler.available.priority_classes


def test_the_chart_sets_every_key_of_the_settings() -> None:
    # Every setting the server reads is a value of the chart's variables (and only those).
    values = yaml.safe_load((chart.CHART / "values.yaml").read_text())
    assert set(values["variables"]) == set(ClusterSettings.model_fields)
    schema = yaml.safe_load((chart.CHART / "values.schema.json").read_text())
    assert set(schema["properties"]["variables"]["properties"]) == set(ClusterSettings.model_fields)


def test_settings_configmap_in_the_files_has_every_key_and_parses() -> None:
    configmap = next(o for _, o in file_objects() if o["kind"] == "ConfigMap")
    assert configmap["metadata"]["name"] == SETTINGS_CONFIGMAP
    assert set(configmap["data"]) == set(ClusterSettings.model_fields)
    settings = ClusterSettings.from_configmap_data(configmap["data"])
    assert settings.exclusion_error() is None
    assert not settings.run_ai_enable and not settings.kueue_installed


def test_deployment_values_are_applied(ca_bundle: str) -> None:
    values = {
        "certs": {"mode": "secret", "secret": {"caBundle": ca_bundle}, "secretName": "my-tls",
                  "clientCAKey": "client-ca.crt"},
        "image": {"repository": "registry.example.com/hw/scheduling-webhook", "tag": "9.9.9"},
        "replicas": 3,
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "500m", "memory": "128Mi"}},
        "priorityClassName": "hopsworks-platform",
        "installers": ["system:serviceaccount:hopsworks:installer", "group:platform-admins"],
        "podGroupers": ["system:serviceaccount:runai:pod-grouper", "group:system:serviceaccounts:kai"],
        "variables": {"run_ai_client_secret_name": "runai-sa", "run_ai_client_secret_key": "secret"},
    }  # fmt: skip
    objects = render(values)
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    c = container(objects)
    assert deployment["spec"]["replicas"] == 3
    assert c["image"] == "registry.example.com/hw/scheduling-webhook:9.9.9"
    assert c["resources"] == values["resources"]
    assert pod["priorityClassName"] == "hopsworks-platform"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["certs"]["secret"]["secretName"] == "my-tls"
    assert c["args"][-2:] == ["--client-ca", "/certs/client-ca.crt"]
    assert volumes["runai-client-secret"]["secret"]["secretName"] == "runai-sa"
    assert volumes["runai-client-secret"]["secret"]["items"] == [{"key": "secret", "path": "secret"}]
    assert env_value(c, "SCHEDULING_WEBHOOK_INSTALLERS") == ",".join(values["installers"])
    assert env_value(c, "SCHEDULING_WEBHOOK_POD_GROUPERS") == ",".join(values["podGroupers"])


def test_no_runai_secret_named_means_no_runai_volume(ca_bundle: str) -> None:
    objects = render({**given_ca(ca_bundle), "variables": {"run_ai_client_secret_name": ""}})
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert "runai-client-secret" not in {v["name"] for v in pod["volumes"]}
    assert "runai-client-secret" not in {m["name"] for m in container(objects)["volumeMounts"]}


# -- Dockerfile ----------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text()
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_dockerfile_is_multi_stage_and_runs_as_the_manifests_uid(rendered: list[dict[str, Any]]) -> None:
    instructions = dockerfile_instructions()
    froms = [rest for word, rest in instructions if word == "FROM"]
    assert len(froms) >= 2
    final_stage = len(instructions) - 1 - [w for w, _ in instructions][::-1].index("FROM")
    users = [rest for word, rest in instructions[final_stage:] if word == "USER"]
    assert users, "the runtime stage sets no USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, f"USER {users[-1]} is not a numeric non-root user"
    pod_uid = one(rendered, "Deployment")["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    assert int(uid) == pod_uid
    assert ("ENTRYPOINT", '["scheduling-webhook"]') in instructions
    cmd = next(rest for word, rest in instructions if word == "CMD")
    assert cmd.startswith('["serve"')


def test_dockerfile_exposes_the_charts_ports_and_carries_oci_labels(rendered: list[dict[str, Any]]) -> None:
    instructions = dockerfile_instructions()
    exposed = {int(p.split("/")[0]) for word, rest in instructions if word == "EXPOSE" for p in rest.split()}
    ports = {p["containerPort"] for c in one(rendered, "Deployment")["spec"]["template"]["spec"]["containers"]
             for p in c["ports"]}  # fmt: skip
    assert exposed == ports
    labels = " ".join(rest for word, rest in instructions if word == "LABEL")
    for key in ("title", "description", "version", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert 'org.opencontainers.image.version="${VERSION}"' in labels


def test_dockerfile_bakes_in_no_secrets() -> None:
    for word, rest in dockerfile_instructions():
        if word in ("ENV", "ARG", "LABEL"):
            assert not re.search(r"secret|password|token|api_key", rest, re.IGNORECASE), rest
        if word in ("COPY", "ADD"):
            assert "certs" not in rest.split()[0], rest
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    # Allow-list: everything is excluded first, and certs/ is never let back in.
    assert "*" in ignore
    assert not [line for line in ignore if line.startswith("!") and "cert" in line]


# -- probes, metrics and the optional NetworkPolicy -------------------------------------------------------


@pytest.mark.parametrize("client_ca_key", ["", "client-ca.crt"])
def test_probes_use_the_probe_port_with_or_without_a_client_ca(ca_bundle: str, client_ca_key: str) -> None:
    objects = render({"certs": {"mode": "secret", "secret": {"caBundle": ca_bundle}, "clientCAKey": client_ca_key}})
    c = container(objects)
    flags = dict(zip(c["args"][1::2], c["args"][2::2], strict=False))
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert named["probes"] == int(flags["--probe-port"]) != int(flags["--port"])
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["port"] == "probes" and c[probe]["httpGet"]["scheme"] == "HTTPS"
    ports = {p["name"]: p for p in one(objects, "Service")["spec"]["ports"]}
    assert ports["metrics"]["targetPort"] == "probes"
    assert ports["https"]["targetPort"] == "https"


def test_the_admission_port_is_the_containers_admission_port_and_asks_for_no_certificate_by_default(
    rendered: list[dict[str, Any]],
) -> None:
    c = container(rendered)
    flags = dict(zip(c["args"][1::2], c["args"][2::2], strict=False))
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert named["admission"] == int(flags["--admission-port"]) == 9443
    assert named["https"] == int(flags["--port"]) == 8443
    assert "--client-ca" not in c["args"] and "--client-name" not in c["args"]
    assert not [o for o in rendered if o["kind"] == "ConfigMap" and "client-ca" in o["metadata"]["name"]]


def test_an_admission_client_ca_is_mounted_and_required_with_the_names_given(ca_bundle: str) -> None:
    ca_pem = base64.b64decode(ca_bundle).decode()
    names = ["kube-apiserver-webhook-client", "apiserver.example.com"]
    objects = render({**given_ca(ca_bundle), "admission": {"clientCA": ca_pem, "clientNames": names}})
    c = container(objects)
    configmap = one(objects, "ConfigMap", "scheduling-webhook-admission-client-ca")
    assert configmap["data"]["ca.crt"] == ca_pem
    volumes = {v["name"]: v for v in one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["admission-client-ca"]["configMap"]["name"] == "scheduling-webhook-admission-client-ca"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["admission-client-ca"] == "/admission-client-ca"
    at = c["args"].index("--client-ca")
    assert c["args"][at : at + 6] == [
        "--client-ca", "/admission-client-ca/ca.crt", "--client-name", names[0], "--client-name", names[1],
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("admission", "certs", "message"),
    [
        ({"clientNames": ["kube-apiserver"]}, {}, "admission.clientNames needs admission.clientCA"),
        ({"clientCA": "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n"}, {"clientCAKey": "ca.crt"},
         "certs.clientCAKey and admission.clientCA both"),
        ({"clientCA": "not a certificate"}, {}, "at '/admission/clientCA'"),
    ],
)  # fmt: skip
def test_admission_client_values_that_cannot_work_are_refused(
    ca_bundle: str, admission: dict[str, Any], certs: dict[str, Any], message: str
) -> None:
    values = given_ca(ca_bundle)
    refused({**values, "certs": {**values["certs"], **certs}, "admission": admission}, message)


def test_network_policy_is_off_by_default(rendered: list[dict[str, Any]]) -> None:
    assert not [o for o in rendered if o["kind"] == "NetworkPolicy"]


def test_kubectl_apply_of_the_manifests_folder_leaves_the_network_policy_out() -> None:
    # `kubectl apply -f manifests/` reads the folder's own files only (no -R): an optional object
    # there would be switched on by the plain command the install page shows.
    kinds = [
        doc.get("kind")
        for path in MANIFESTS.iterdir()
        if path.is_file() and path.suffix in (".yaml", ".yml", ".json")
        for doc in yaml.safe_load_all(path.read_text())
        if isinstance(doc, dict)
    ]
    assert "NetworkPolicy" not in kinds


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_network_policy_admits_the_apiserver_the_api_clients_and_the_scraper(ca_bundle: str, version: str) -> None:
    values = {
        **given_ca(ca_bundle),
        "networkPolicy": {"enabled": True, "apiserverCIDRs": ["10.0.0.10/32", "fd00::1/128"]},
    }
    objects = render(values, "platform")
    kinds = [o["kind"] for o in objects]
    policy = one(objects, "NetworkPolicy")
    kubernetes_validate.validate(policy, version, strict=True)
    # helm installs NetworkPolicies right after Namespaces: before the webhooks send reviews.
    assert kinds.index("NetworkPolicy") < kinds.index("ValidatingWebhookConfiguration")
    assert policy["metadata"]["namespace"] == "platform"
    labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert selector_matches(policy["spec"]["podSelector"], labels)
    apiserver, clients, scraper = policy["spec"]["ingress"]
    assert apiserver["from"] == [{"ipBlock": {"cidr": "10.0.0.10/32"}}, {"ipBlock": {"cidr": "fd00::1/128"}}]
    # The apiserver alone reaches the admission port and the aggregated API's; the API clients
    # reach the console's port only.
    assert [p["port"] for p in apiserver["ports"]] == ["admission", "aggregated"]
    assert clients["from"] == [{"podSelector": {}}]  # pods of the install namespace
    assert [p["port"] for p in clients["ports"]] == ["https"]
    assert scraper["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
    assert [p["port"] for p in scraper["ports"]] == ["probes"]
    named = {p["name"] for p in container(objects)["ports"]}
    assert {"https", "admission", "probes", "aggregated"} <= named


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"enabled": True}, "networkPolicy.apiserverCIDRs: name the addresses"),
        ({"enabled": True, "apiserverCIDRs": ["not-an-ip"]}, "at '/networkPolicy/apiserverCIDRs/0'"),
        (
            {"enabled": True, "apiserverCIDRs": ["10.0.0.1/32"], "apiClient": []},
            "at '/networkPolicy': additional properties 'apiClient' not allowed",
        ),
    ],
)
def test_network_policy_refuses_values_that_would_lock_out_the_apiserver(
    ca_bundle: str, policy: dict[str, Any], message: str
) -> None:
    refused({**given_ca(ca_bundle), "networkPolicy": policy}, message)


def test_admission_policies_follow_the_install_namespace(ca_bundle: str) -> None:
    objects = render({**given_ca(ca_bundle), "createNamespace": True}, "platform")
    policies = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    assert len(policies) == 3
    own = "system:serviceaccount:platform:scheduling-webhook"
    for policy in policies:
        if policy["metadata"]["name"] == "hopsworks-scheduling-webhook-policy-params":
            # Everyone's writes of the parameters are checked; only the server's pass.
            (check, *_) = policy["spec"]["validations"]
            assert f"request.userInfo.username == '{own}'" in check["expression"]
            continue
        (condition,) = policy["spec"]["matchConditions"]
        assert condition["expression"] == f"request.userInfo.username == '{own}'"
    bindings = {o["spec"]["policyName"]: o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert set(bindings) == {p["metadata"]["name"] for p in policies}
    own = bindings["hopsworks-scheduling-webhook-own-objects"]["spec"]["matchResources"]["namespaceSelector"]
    assert own["matchExpressions"][0]["values"] == ["platform"]


# -- the uninstall hook -------------------------------------------------------------------------------


def test_the_uninstall_hook_runs_after_the_chart_is_gone_and_cleans_up_after_itself() -> None:
    objects = hooks({}, "platform")
    assert sorted(o["kind"] for o in objects) == sorted(
        ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Job",
         "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"]
    )  # fmt: skip
    for obj in objects:
        annotations = obj["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "post-delete", obj["kind"]
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded", obj["kind"]
        kubernetes_validate.validate(obj, K8S_VERSIONS[0], strict=True)
    weights = {o["kind"]: int(o["metadata"]["annotations"]["helm.sh/hook-weight"]) for o in objects}
    assert max(w for k, w in weights.items() if k != "Job") < weights["Job"]  # its RBAC first
    job = one(objects, "Job")
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["args"][0] == "uninstall-cleanup" and pod["restartPolicy"] == "Never"
    account = one(objects, "ServiceAccount")["metadata"]["name"]
    assert pod["serviceAccountName"] == account != "scheduling-webhook"
    # Only what the cleanup does: namespaces patched, the server's ConfigMaps and Lease deleted.
    cluster = rules_of(objects, "ClusterRole")
    assert allows(cluster, "", "namespaces", "patch") and not allows(cluster, "", "namespaces", "delete")
    role = rules_of(objects, "Role")
    assert allows(role, "", "configmaps", "delete") and allows(role, "coordination.k8s.io", "leases", "delete",
                                                                   "scheduling-webhook-leader")  # fmt: skip
    assert not allows(role, "coordination.k8s.io", "leases", "delete", "someone-elses-lease")
    for rule in rules_of(objects, "ClusterRole") + rules_of(objects, "Role"):
        assert "secrets" not in rule["resources"] and "*" not in rule["verbs"]
    # RBAC lets the Job patch every namespace; its own policy narrows that to taking this
    # system's keys away, and the Job waits until that policy is in force.
    policy = one(objects, "ValidatingAdmissionPolicy")
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == 'system:serviceaccount:platform:{account}'"
    assert one(objects, "ValidatingAdmissionPolicyBinding")["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert c["args"][-2:] == ["--guard-policy", policy["metadata"]["name"]]
    assert not hooks({"uninstallCleanup": {"enabled": False}})


def test_the_log_values_become_the_servers_log_options() -> None:
    def args(values: dict[str, Any] | None) -> list[str]:
        deployment = next(o for o in chart.render(values) if o["kind"] == "Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        return list(container["args"])

    default = args(None)
    assert default[:5] == ["serve", "--log-level", "INFO", "--log-format", "text"]
    assert args({"log": {"level": "DEBUG", "format": "json"}})[:5] == [
        "serve",
        "--log-level",
        "DEBUG",
        "--log-format",
        "json",
    ]
    with pytest.raises(HelmFailed):
        chart.render({"log": {"format": "logfmt"}})


# -- the values operators expect from a chart ------------------------------------------------------


def test_pull_secrets_node_selector_tolerations_and_affinity_reach_the_pod(ca_bundle: str) -> None:
    placement = {
        "imagePullSecrets": [{"name": "registry-credentials"}],
        "nodeSelector": {"node-role.example.com/infra": "true"},
        "tolerations": [{"key": "infra", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}]}}},
    }  # fmt: skip
    deployment = one(render({**given_ca(ca_bundle), **placement}), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    for key, value in placement.items():
        assert pod[key] == value, key
    # The chart's own spread of the replicas stays beside the operator's placement.
    assert {t["topologyKey"] for t in pod["topologySpreadConstraints"]} == {
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    }
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(deployment, version, strict=True)
    # By default none of them is set: the pod goes wherever the scheduler puts it.
    default_pod = one(render(given_ca(ca_bundle)), "Deployment")["spec"]["template"]["spec"]
    assert not set(placement) & set(default_pod)
    refused({"tolerations": [{"key": "infra", "operator": "Maybe"}]}, "/tolerations/0/operator")
    refused({"imagePullSecrets": ["registry-credentials"]}, "/imagePullSecrets/0")


def test_security_contexts_can_be_overridden_and_leave_the_uid_to_the_platform(ca_bundle: str) -> None:
    # OpenShift's restricted SCC assigns each namespace a UID range and refuses a pod that names
    # another UID: the values must be able to leave the UID, GID and fsGroup out entirely.
    platform_uid = {
        "podSecurityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None},
        "securityContext": {"runAsUser": None, "runAsGroup": None},
    }
    objects = render({**given_ca(ca_bundle), **platform_uid})
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    c = container(objects)
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        assert key not in pod["securityContext"], key
    for key in ("runAsUser", "runAsGroup"):
        assert key not in c["securityContext"], key
    # What does not name an identity stays hardened.
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(deployment, version, strict=True)

    other = render({**given_ca(ca_bundle), "podSecurityContext": {"runAsUser": 20000, "fsGroup": 20000},
                    "securityContext": {"runAsUser": 20000}})  # fmt: skip
    assert one(other, "Deployment")["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 20000
    assert container(other)["securityContext"]["runAsUser"] == 20000
    refused({"securityContext": {"runAsUsr": 1}}, "runAsUsr")
    refused({"podSecurityContext": {"runAsUser": "root"}}, "/podSecurityContext/runAsUser")


def test_pod_labels_and_extra_env_are_added_beside_the_charts_own(ca_bundle: str) -> None:
    values = {
        **given_ca(ca_bundle),
        "podLabels": {"team": "platform", "cost-center": "ml"},
        "extraEnv": [
            {"name": "HTTPS_PROXY", "value": "http://proxy.example.com:3128"},
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
    }
    objects = render(values)
    deployment = one(objects, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "platform" and labels["cost-center"] == "ml"
    assert labels["app.kubernetes.io/name"] == "scheduling-webhook"
    c = container(objects)
    names = [e["name"] for e in c["env"]]
    assert names[-2:] == ["HTTPS_PROXY", "NODE_NAME"]
    assert env_value(c, "NODE_NAME") == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env_value(c, "POD_NAMESPACE") == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert len(set(names)) == len(names)
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(deployment, version, strict=True)
    # The Service, the PDB and the spread select on the chart's labels; the server reads its own
    # variables: neither may be replaced by a value.
    refused({"podLabels": {"app.kubernetes.io/name": "other"}},
            "podLabels.app.kubernetes.io/name is a label the chart sets itself")  # fmt: skip
    refused({"extraEnv": [{"name": "SCHEDULING_WEBHOOK_INSTALLERS", "value": "anyone"}]},
            "extraEnv names SCHEDULING_WEBHOOK_INSTALLERS, which the chart sets itself")  # fmt: skip
    refused({"extraEnv": [{"value": "no name"}]}, "/extraEnv/0")
    refused({"podLabels": {"team": "has spaces"}}, "/podLabels/team")


def test_service_account_annotations(ca_bundle: str) -> None:
    annotations = {"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/scheduling-webhook"}
    account = one(render({**given_ca(ca_bundle), "serviceAccount": {"annotations": annotations}}), "ServiceAccount")
    assert account["metadata"]["annotations"] == annotations
    assert "annotations" not in one(render(given_ca(ca_bundle)), "ServiceAccount")["metadata"]


def test_every_object_carries_the_standard_labels() -> None:
    chart_yaml = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())
    text = chart.helm("template", "platform-hooks", str(chart.CHART), "--namespace", "hopsworks",
                      "--set", chart.OFFLINE_CA)  # fmt: skip
    objects = [o for o in yaml.safe_load_all(text) if o]
    assert objects
    for obj in objects:
        labels = obj["metadata"].get("labels") or {}
        where = f"{obj['kind']} {obj['metadata']['name']}"
        assert labels.get("app.kubernetes.io/instance") == "platform-hooks", where
        assert labels.get("helm.sh/chart") == f"{chart_yaml['name']}-{chart_yaml['version']}", where
    # The selectors keep to the name: a second release or a chart upgrade never changes what they pick.
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "scheduling-webhook"}


def test_certs_mode_helm_is_refused_without_a_cluster_unless_asked(ca_bundle: str) -> None:
    """Argo CD renders with `helm template`, where lookup finds nothing: certs.mode helm would issue
    a new CA at every sync. The chart tells (kube-system is not found) and refuses, naming the modes
    to use; the other modes, and a render that says it is applied once, are rendered."""
    with pytest.raises(HelmFailed) as failed:
        chart.helm("template", chart.RELEASE, str(chart.CHART), "--namespace", "hopsworks")
    assert "With GitOps use certs.mode certManager or secret" in failed.value.stderr, failed.value.stderr
    for values in (given_ca(ca_bundle), {"certs": {"mode": "certManager"}}):
        chart.helm("template", chart.RELEASE, str(chart.CHART), "--namespace", "hopsworks", values=values)
    chart.helm("template", chart.RELEASE, str(chart.CHART), "--namespace", "hopsworks", "--set", chart.OFFLINE_CA)


def test_the_admission_policies_template_is_generated_from_the_compiler() -> None:
    assert policy_template.TEMPLATE.read_text() == policy_template.current(), (
        "manifests/chart/templates/14-admission-policies.yaml is not what "
        "webhook/core/admission_policies.py compiles: run `make manifests`"
    )


def test_the_pod_webhook_conditions_are_generated_from_the_module() -> None:
    assert webhook_conditions_template.TEMPLATE.read_text() == webhook_conditions_template.current(), (
        "manifests/chart/templates/_webhook_conditions.tpl is not what webhook/core/webhook_conditions.py "
        "makes: run `make manifests`"
    )


def test_the_admission_policies_render_only_where_the_apiserver_serves_them() -> None:
    """Rendered with the value on and the kind served: the compiler's objects; without the kind
    (helm template's built-in versions, a cluster before 1.36) or with the value off: none."""
    kinds = ("MutatingAdmissionPolicy", "ValidatingAdmissionPolicy")

    def rendered(values: dict[str, Any], *api_versions: str) -> list[dict[str, Any]]:
        extra = [a for v in api_versions for a in ("--api-versions", v)]
        text = chart.helm("template", chart.RELEASE, str(chart.CHART), "--namespace", "sw", "--set",
                          chart.OFFLINE_CA, *extra, values=values)  # fmt: skip
        return [o for o in yaml.safe_load_all(text) if o and o["kind"].removesuffix("Binding") in kinds
                and o["metadata"]["name"] == POLICY_NAME]  # fmt: skip

    served = rendered({}, policy_template.SERVED)
    for obj in served:
        obj["metadata"].pop("labels")
    assert served == policy_objects("v1")
    assert rendered({}) == []
    assert rendered({"admissionPolicies": {"enabled": False}}, policy_template.SERVED) == []


def test_the_values_reference_is_generated_from_the_schema() -> None:
    assert values_reference.PAGE.read_text() == values_reference.current(), (
        "docs/values.md is not what the chart's schema says: run `make manifests`"
    )
    schema = json.loads((chart.CHART / "values.schema.json").read_text())
    values = yaml.safe_load((chart.CHART / "values.yaml").read_text())

    def paths(node: Any, prefix: str = "") -> Iterator[str]:
        if isinstance(node, dict):
            for key, child in node.items():
                yield f"{prefix}{key}"
                yield from paths(child, f"{prefix}{key}.")

    page = values_reference.PAGE.read_text()
    for path in paths(values):
        described = not path.startswith("variables.scheduler.") and not path.startswith("resources.")
        if described:
            assert f"| `{path}` |" in page, f"{path} of values.yaml has no row in docs/values.md"
    del schema["properties"]["image"]["properties"]["tag"]["description"]
    with pytest.raises(ValueError, match=re.escape("image.tag has no description")):
        values_reference.reference(schema, values)


def test_admission_policies_off_drops_their_rbac_and_the_parameters_policy(ca_bundle: str) -> None:
    objects = render({**given_ca(ca_bundle), "admissionPolicies": {"enabled": False}})
    cluster = rules_of(objects, "ClusterRole")
    assert not allows(cluster, "", "configmaps", "create", "scheduling-webhook-policy")
    assert not allows(
        cluster, "admissionregistration.k8s.io", "mutatingadmissionpolicies", "patch", "scheduling-webhook-pods"
    )
    names = {o["metadata"]["name"] for o in objects if o["kind"].startswith("ValidatingAdmissionPolicy")}
    assert "hopsworks-scheduling-webhook-policy-params" not in names
    assert "hopsworks-scheduling-webhook-own-objects" in names


def test_pod_webhooks_of_namespaces_the_policies_decide_are_narrowed(ca_bundle: str) -> None:
    """The leader labels a project the compiled policies decide; its pods reach the pod webhooks of
    the second configurations, and only when they need outside state. The selectors never overlap."""
    objects = render(given_ca(ca_bundle), api_versions=[policy_template.SERVED])
    main, decided = webhooks(objects), decided_hooks(objects)
    assert set(decided) == {"mutate-pods.scheduling.hopsworks.ai", "validate-pods.scheduling.hopsworks.ai"}
    labelled = {"kubernetes.io/metadata.name": "team-a", "hopsworks.ai/project": "team-a",
                "scheduling.hopsworks.ai/admission-policies": "on"}  # fmt: skip
    plain = {k: v for k, v in labelled.items() if k != "scheduling.hopsworks.ai/admission-policies"}
    for name, hook in decided.items():
        first = main[name]
        assert {k: v for k, v in hook.items() if k not in ("namespaceSelector", "matchConditions")} == {
            k: v for k, v in first.items() if k not in ("namespaceSelector", "_configuration", "matchConditions")
        }
        assert selector_matches(hook["namespaceSelector"], labelled) and not selector_matches(
            hook["namespaceSelector"], plain
        )
        assert selector_matches(first["namespaceSelector"], plain) and not selector_matches(
            first["namespaceSelector"], labelled
        )
        (condition,) = hook["matchConditions"]
        for needed in ("gpu", "kueue.x-k8s.io/", "runai", "kai.scheduler/", "scheduling.hopsworks.ai/"):
            assert needed in condition["expression"], needed
        # The labels the policy writes over what a pod came with call nothing there; an owner Run:ai's
        # rules would refuse, or a claim, calls the webhook: the owners reviewed are core.preemptibility's.
        assert "k != 'runai/queue'" in condition["expression"]
        assert "k != 'scheduling.hopsworks.ai/affinity'" in condition["expression"]
        assert f"k != '{REFUSAL_ANNOTATION}'" in condition["expression"]
        assert "k != 'kai.scheduler/preemptibility'" in condition["expression"]
        assert "has(object.spec.resourceClaims)" in condition["expression"]
        listed = re.search(r"ownerReferences\[0\]\.kind in \[([^]]*)\]", condition["expression"])
        assert listed is not None
        assert sorted(re.findall(r"'([^']*)'", listed.group(1))) == sorted(f"{v} {k}" for v, k in REVIEWED_REFS)
        # The main validate-pods is narrowed too (a plain pod there makes one call), with every Run:ai
        # and KAI label calling: the mutation writes them, and validate-pods checks them. mutate-pods is not.
        if name.startswith("validate"):
            (main_condition,) = first["matchConditions"]
            assert "k.startsWith('runai') || k.startsWith('kai.scheduler/')" in main_condition["expression"]
            assert "'runai/queue'" not in main_condition["expression"]
            # A node label choice calls validate-pods there: in warn mode it counts the would-be refusals.
            assert "'scheduling.hopsworks.ai/affinity'" not in main_condition["expression"]
        else:
            assert first.get("matchConditions") is None
    # Where the policies are not rendered (turned off, or the kind not served: an apiserver before
    # 1.36), no namespace is handed to them: a labelled one stays the main configurations'.
    for off in (
        render({**given_ca(ca_bundle), "admissionPolicies": {"enabled": False}}, api_versions=[policy_template.SERVED]),
        render(given_ca(ca_bundle)),
    ):
        assert decided_hooks(off) == {}
        configurations = [o for o in off if o["kind"].endswith("WebhookConfiguration")]
        assert "scheduling.hopsworks.ai/admission-policies" not in json.dumps(configurations)
        assert not [o for o in off if o["kind"].startswith("MutatingAdmissionPolicy")]
    helpers = (chart.CHART / "templates" / "_helpers.tpl").read_text()
    assert f'.Capabilities.APIVersions.Has "{policy_template.SERVED}"' in helpers
