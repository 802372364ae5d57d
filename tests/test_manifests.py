"""manifests/, the renderer, and the Dockerfile.

Schemas come from kubernetes-validate in strict mode (unknown fields fail), at the oldest
Kubernetes the manifests claim (1.30: matchConditions GA, the preStop sleep action) and the
newest the package ships. The selector checks evaluate the label selectors the way the apiserver
does, against namespaces labelled as an adversary might label them.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from webhook import manifest_files, manifests
from webhook.manifests import RenderError, render
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
SERVER_PATHS = {"/mutate/pods", "/mutate/workloads", "/validate/pods", "/validate/workloads", "/validate/settings"}
CLUSTER_SCOPED = (
    "Namespace",
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


@pytest.fixture
def example_values(ca_bundle: str) -> dict[str, Any]:
    values = manifest_files.load_values(EXAMPLE_VALUES)
    values.pop("caFile")
    values["caBundle"] = ca_bundle
    return values


@pytest.fixture
def rendered(ca_bundle: str) -> list[dict[str, Any]]:
    return render({"caBundle": ca_bundle})


def file_objects() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in manifest_files.resource_files(MANIFESTS):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                out.append((path.name, doc))
    return out


def one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def webhooks(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    hooks = {}
    for obj in objects:
        if obj["kind"] in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            for hook in obj["webhooks"]:
                hooks[hook["name"]] = {**hook, "_configuration": obj}
    return hooks


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


def run_cli(argv: list[str]) -> int:
    from webhook.cli import build_parser

    args: argparse.Namespace = build_parser().parse_args(argv)
    return manifests.manifests_command(args)


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
    assert set(kinds[-2:]) == {"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
    for kind in ("ServiceAccount", "ClusterRole", "Role", "ConfigMap", "Service", "Deployment"):
        assert kind in kinds
    assert kinds.index("ServiceAccount") < kinds.index("Deployment")
    assert "PodDisruptionBudget" in kinds


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_object_passes_the_schema(example_values: dict[str, Any], version: str) -> None:
    objects = render({**example_values, "namespace": "platform", "clientCAKey": "client-ca.crt"})
    assert len(objects) == len(file_objects())
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)


def test_values_example_renders_through_the_cli(
    tmp_path: Path, ca_pem: bytes, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As manifests/README.md has it: from the checkout's root, the values copied anywhere; a relative
    # caFile is read from the current directory, not from the values file's folder.
    (tmp_path / "certs" / "cluster").mkdir(parents=True)
    (tmp_path / "certs" / "cluster" / "ca.crt").write_bytes(ca_pem)
    (tmp_path / "elsewhere").mkdir()
    values = tmp_path / "elsewhere" / "my-values.yaml"
    values.write_text(EXAMPLE_VALUES.read_text())
    monkeypatch.chdir(tmp_path)
    assert run_cli(["manifests", "--values", str(values)]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert [d["kind"] for d in docs] == [o["kind"] for _, o in file_objects()]
    bundle = webhooks(docs)["mutate-pods.scheduling.hopsworks.ai"]["clientConfig"]["caBundle"]
    assert base64.b64decode(bundle) == ca_pem


def test_a_missing_ca_file_names_the_directory_it_was_read_from(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"caFile": "certs/cluster/ca.crt"}))
    monkeypatch.chdir(tmp_path)
    assert run_cli(["manifests", "--values", str(values)]) == 1
    err = capsys.readouterr().err
    assert f"cannot read certs/cluster/ca.crt (relative to the current directory, {tmp_path})" in err


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
    values = manifest_files.load_values(EXAMPLE_VALUES)
    named = set(values["settings"]["scheduler"]["available"]["priorityClasses"])
    shipped = list(yaml.safe_load_all((ROOT / "examples" / "priorityclasses.yaml").read_text()))
    for obj in shipped:
        kubernetes_validate.validate(obj, K8S_VERSIONS[0], strict=True)
    assert named == {obj["metadata"]["name"] for obj in shipped}
    assert "examples/priorityclasses.yaml" in (MANIFESTS / "README.md").read_text()


def test_cert_manager_switch_issues_the_secret_and_injects_the_ca() -> None:
    objects = render({"namespace": "platform", "certManager": {"enabled": True}})
    kinds = [o["kind"] for o in objects]
    # Issuer and Certificate right after the Service, before the Deployment that mounts the Secret.
    assert kinds.index("Service") < kinds.index("Issuer") < kinds.index("Certificate") < kinds.index("Deployment")
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
    objects = render({"certManager": {"enabled": True, "issuerRef": {"kind": "ClusterIssuer", "name": "corp-ca"}}})
    assert "Issuer" not in [o["kind"] for o in objects]
    certificate = next(o for o in objects if o["kind"] == "Certificate")
    assert certificate["spec"]["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}
    with pytest.raises(RenderError, match="leave caBundle and caFile out"):
        render({"caBundle": ca_bundle, "certManager": {"enabled": True}})
    with pytest.raises(RenderError, match="unknown keys"):
        render({"caBundle": ca_bundle, "certManager": {"enable": True}})


def test_metrics_switches_add_scrape_annotations_and_a_service_monitor(ca_bundle: str) -> None:
    plain = render({"caBundle": ca_bundle})
    assert "ServiceMonitor" not in [o["kind"] for o in plain]
    objects = render(
        {"caBundle": ca_bundle, "namespace": "platform", "metrics": {"scrapeAnnotations": True, "serviceMonitor": True}}
    )
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/scheme"] == "https"
    kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)
    monitor = next(o for o in objects if o["kind"] == "ServiceMonitor")
    endpoint = monitor["spec"]["endpoints"][0]
    service = next(o for o in objects if o["kind"] == "Service")
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["tlsConfig"]["serverName"] == "scheduling-webhook.platform.svc"
    with pytest.raises(RenderError, match=r"metrics\.serviceMonitor"):
        render({"caBundle": ca_bundle, "metrics": {"serviceMonitor": "yes"}})


def test_out_writes_one_file_per_object_in_apply_order(tmp_path: Path, ca_bundle: str) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({"caBundle": ca_bundle, "namespace": "platform"}))
    out = tmp_path / "out"
    assert run_cli(["manifests", "--values", str(values), "--out", str(out)]) == 0
    files = sorted(out.iterdir())
    expected = render({"caBundle": ca_bundle, "namespace": "platform"})
    assert [yaml.safe_load(f.read_text()) for f in files] == expected
    assert all(re.match(r"^\d{2}-", f.name) for f in files)


# -- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        {"settings": {"kueue_installed": True, "run_ai_enable": True, "run_ai_client_id": "hw"}},
        {"settings": {"kueue_installed": "true", "run_ai_enable": "true", "run_ai_client_id": "hw"}},
        {
            "settings": {"run_ai_enable": True, "run_ai_client_id": "hw"},
            "global": {"_hopsworks": {"kueue": {"enabled": True}}},
        },
    ],
    ids=["flags", "string-flags", "helm-kueue-flag"],
)
def test_render_refuses_kueue_and_runai_both_on(
    values: dict[str, Any], ca_bundle: str, tmp_path: Path, capsys: Any
) -> None:
    with pytest.raises(RenderError, match="cannot both be true"):
        render({**values, "caBundle": ca_bundle})
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump({**values, "caBundle": ca_bundle}))
    assert run_cli(["manifests", "--values", str(path)]) != 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "refusing to render" in captured.err and "run_ai_enable" in captured.err


def test_either_one_alone_renders(ca_bundle: str) -> None:
    render({"caBundle": ca_bundle, "settings": {"kueue_installed": True}})
    render(
        {
            "caBundle": ca_bundle,
            "settings": {"run_ai_enable": True, "run_ai_client_id": "hw"},
            "global": {"_hopsworks": {"kueue": {"enabled": False}}},
        }
    )


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"namespaec": "x"}, "unknown values"),
        ({"settings": {"run_ai_enabled": True}}, "unknown keys"),
        ({"settings": {"run_ai_project_gpu_quota": -1}}, "run_ai_project_gpu_quota"),
        ({"settings": {"scheduler": "available: [unclosed"}}, "scheduler"),
        ({"settings": {"run_ai_enable": True, "run_ai_client_id": ""}}, "run_ai_client_id"),
        ({"namespace": "kube-system"}, "system namespace"),
        ({"namespace": "Not_A_Name"}, "not a valid namespace"),
        ({"replicas": 0}, "replicas"),
        ({"installers": "group:system:masters"}, "installers"),
        ({"caBundle": None}, "no CA"),
        ({"caBundle": "not base64!"}, "base64"),
        ({"caBundle": base64.b64encode(b"hello").decode()}, "PEM"),
    ],
)
def test_render_refuses_bad_values(values: dict[str, Any], message: str, ca_bundle: str) -> None:
    with pytest.raises(RenderError, match=message):
        render({"caBundle": ca_bundle, **values})


# -- webhook configurations ----------------------------------------------------------------------


def test_mutating_configuration_is_called_before_kueue_and_runai(rendered: list[dict[str, Any]]) -> None:
    mutating = one(rendered, "MutatingWebhookConfiguration")
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
    names += [h["name"] for h in one(rendered, "MutatingWebhookConfiguration")["webhooks"]]
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
        assert ref["port"] == service["spec"]["ports"][0]["port"] == 443, name
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


@pytest.mark.parametrize("install_namespace", ["hopsworks", "platform"])
def test_pod_webhooks_reach_project_namespaces_only(install_namespace: str, ca_bundle: str) -> None:
    hooks = webhooks(render({"caBundle": ca_bundle, "namespace": install_namespace}))
    for name in POD_HOOKS:
        hook = hooks[name]
        assert hook_reaches(hook, "team-a"), name
        assert not hook_reaches(hook, "team-b", project=False), name
        # Even if someone labels them as projects, these are never sent to us.
        for excluded in ("kube-system", "kube-public", "kube-node-lease", install_namespace):
            assert not hook_reaches(hook, excluded), f"{name} reaches {excluded}"


@pytest.mark.parametrize("install_namespace", ["hopsworks", "platform"])
def test_settings_webhook_reaches_only_the_install_namespace(install_namespace: str, ca_bundle: str) -> None:
    hook = webhooks(render({"caBundle": ca_bundle, "namespace": install_namespace}))[
        "validate-settings.scheduling.hopsworks.ai"
    ]
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


def test_namespace_webhook_selects_project_namespaces_by_object(rendered: list[dict[str, Any]]) -> None:
    hook = webhooks(rendered)["validate-namespaces.scheduling.hopsworks.ai"]
    assert hook["rules"][0]["resources"] == ["namespaces"]
    assert hook["rules"][0]["scope"] == "Cluster"
    assert "namespaceSelector" not in hook  # ignored for cluster-scoped resources
    assert hook_reaches(hook, "team-a")
    assert not hook_reaches(hook, "team-b", project=False)
    assert not hook_reaches(hook, "kube-system")
    assert not hook_reaches(hook, "hopsworks")


def test_workload_webhook_covers_pod_owners(rendered: list[dict[str, Any]]) -> None:
    hook = webhooks(rendered)["validate-workloads.scheduling.hopsworks.ai"]
    covered = {(g, r) for rule in hook["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert {("apps", "deployments"), ("apps", "statefulsets"), ("batch", "jobs")} <= covered
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
    # Issue 10.6: the first lists of a large cluster take minutes; liveness must not cut them short.
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
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
    objects = render({"caBundle": ca_bundle, "replicas": 1})
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
            # The only delete: the install namespace's own GPU reservation ConfigMaps (swept by the
            # leader once their namespace is gone).
            if "delete" in rule["verbs"]:
                assert (kind, rule["resources"]) == ("Role", ["configmaps"]), rule
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
    assert allows(cluster, "", "events", "create")
    assert allows(cluster, "authentication.k8s.io", "tokenreviews", "create")
    assert allows(cluster, "authorization.k8s.io", "subjectaccessreviews", "create")

    role = rules_of(rendered, "Role")
    lease = env_value(container(rendered), "SCHEDULING_WEBHOOK_LEASE_NAME")
    assert allows(role, "coordination.k8s.io", "leases", "update", lease)
    assert allows(role, "coordination.k8s.io", "leases", "get", lease)
    assert not allows(role, "coordination.k8s.io", "leases", "update", "someone-elses-lease")
    assert allows(role, "", "configmaps", "watch") and allows(role, "", "configmaps", "update")


@pytest.mark.parametrize("install_namespace", ["hopsworks", "platform"])
def test_rbac_binds_the_install_namespaces_account(install_namespace: str, ca_bundle: str) -> None:
    objects = render({"caBundle": ca_bundle, "namespace": install_namespace})
    account = one(objects, "ServiceAccount")["metadata"]
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == account["name"]
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = one(objects, kind)
        assert binding["roleRef"]["name"] == one(objects, role_kind)["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": install_namespace}
        ]
    assert one(objects, "Role")["metadata"]["namespace"] == install_namespace


# -- values substitution -----------------------------------------------------------------------------


def test_namespace_follows_the_values_everywhere(ca_bundle: str) -> None:
    objects = render({"caBundle": ca_bundle, "namespace": "platform"})
    assert one(objects, "Namespace")["metadata"]["name"] == "platform"
    for obj in objects:
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == "platform", obj["kind"]
        for path, value in strings(obj):
            # "hopsworks" as a whole value can only be the old namespace (label values aside:
            # part-of names the platform).
            if value == "hopsworks":
                assert ".labels." in path, f"{obj['kind']}{path} still says hopsworks"
    for hook in webhooks(objects).values():
        assert hook["clientConfig"]["service"]["namespace"] == "platform"


def test_create_namespace_false_leaves_it_out(ca_bundle: str) -> None:
    objects = render({"caBundle": ca_bundle, "createNamespace": False})
    assert not [o for o in objects if o["kind"] == "Namespace"]


def test_settings_values_reach_the_configmap(example_values: dict[str, Any]) -> None:
    values = {
        **example_values,
        "settings": {
            **example_values["settings"],
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


def test_settings_configmap_in_the_files_has_every_key_and_parses() -> None:
    configmap = next(o for _, o in file_objects() if o["kind"] == "ConfigMap")
    assert configmap["metadata"]["name"] == SETTINGS_CONFIGMAP
    assert set(configmap["data"]) == set(ClusterSettings.model_fields)
    settings = ClusterSettings.from_configmap_data(configmap["data"])
    assert settings.exclusion_error() is None
    assert not settings.run_ai_enable and not settings.kueue_installed


def test_deployment_values_are_applied(ca_bundle: str) -> None:
    values = {
        "caBundle": ca_bundle,
        "image": "registry.example.com/hw/scheduling-webhook:9.9.9",
        "replicas": 3,
        "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
        "priorityClassName": "hopsworks-platform",
        "tlsSecretName": "my-tls",
        "clientCAKey": "client-ca.crt",
        "installers": ["system:serviceaccount:hopsworks:installer", "group:platform-admins"],
        "settings": {"run_ai_client_secret_name": "runai-sa", "run_ai_client_secret_key": "secret"},
    }
    objects = render(values)
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    c = container(objects)
    assert deployment["spec"]["replicas"] == 3
    assert c["image"] == values["image"]
    assert c["resources"] == values["resources"]
    assert pod["priorityClassName"] == "hopsworks-platform"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["certs"]["secret"]["secretName"] == "my-tls"
    assert c["args"][-2:] == ["--client-ca", "/certs/client-ca.crt"]
    assert volumes["runai-client-secret"]["secret"]["secretName"] == "runai-sa"
    assert volumes["runai-client-secret"]["secret"]["items"] == [{"key": "secret", "path": "secret"}]
    assert env_value(c, "SCHEDULING_WEBHOOK_INSTALLERS") == ",".join(values["installers"])


def test_no_runai_secret_named_means_no_runai_volume(ca_bundle: str) -> None:
    objects = render({"caBundle": ca_bundle, "settings": {"run_ai_client_secret_name": ""}})
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert "runai-client-secret" not in {v["name"] for v in pod["volumes"]}
    assert "runai-client-secret" not in {m["name"] for m in container(objects)["volumeMounts"]}


def test_render_does_not_change_the_files(ca_bundle: str) -> None:
    before = file_objects()
    render({"caBundle": ca_bundle, "namespace": "platform", "replicas": 5})
    assert file_objects() == before


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
    objects = render({"caBundle": ca_bundle, "clientCAKey": client_ca_key})
    c = container(objects)
    flags = dict(zip(c["args"][1::2], c["args"][2::2], strict=False))
    named = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert named["probes"] == int(flags["--probe-port"]) != int(flags["--port"])
    for probe in ("readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["port"] == "probes" and c[probe]["httpGet"]["scheme"] == "HTTPS"
    ports = {p["name"]: p for p in one(objects, "Service")["spec"]["ports"]}
    assert ports["metrics"]["targetPort"] == "probes"
    assert ports["https"]["targetPort"] == "https"


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
    assert (MANIFESTS / "optional" / "networkpolicy.yaml").is_file()


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_network_policy_admits_the_apiserver_the_api_clients_and_the_scraper(ca_bundle: str, version: str) -> None:
    values = {
        "caBundle": ca_bundle,
        "namespace": "platform",
        "networkPolicy": {"enabled": True, "apiserverCIDRs": ["10.0.0.10/32", "fd00::1/128"]},
    }
    objects = render(values)
    kinds = [o["kind"] for o in objects]
    policy = one(objects, "NetworkPolicy")
    kubernetes_validate.validate(policy, version, strict=True)
    assert kinds.index("NetworkPolicy") < kinds.index("ValidatingWebhookConfiguration")
    assert policy["metadata"]["namespace"] == "platform"
    labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert selector_matches(policy["spec"]["podSelector"], labels)
    apiserver, clients, scraper = policy["spec"]["ingress"]
    assert apiserver["from"] == [{"ipBlock": {"cidr": "10.0.0.10/32"}}, {"ipBlock": {"cidr": "fd00::1/128"}}]
    assert [p["port"] for p in apiserver["ports"]] == ["https"]
    assert clients["from"] == [{"podSelector": {}}]  # pods of the install namespace
    assert scraper["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
    assert [p["port"] for p in scraper["ports"]] == ["probes"]
    named = {p["name"] for p in container(objects)["ports"]}
    assert {"https", "probes"} <= named


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"enabled": True}, "apiserverCIDRs: name the addresses"),
        ({"enabled": True, "apiserverCIDRs": ["not-an-ip"]}, "not an address range"),
        ({"enabled": True, "apiserverCIDRs": ["10.0.0.1/32"], "apiClient": []}, "unknown keys"),
    ],
)
def test_network_policy_refuses_values_that_would_lock_out_the_apiserver(
    ca_bundle: str, policy: dict[str, Any], message: str
) -> None:
    with pytest.raises(RenderError, match=message):
        render({"caBundle": ca_bundle, "networkPolicy": policy})


def test_admission_policies_follow_the_install_namespace(ca_bundle: str) -> None:
    objects = render({"caBundle": ca_bundle, "namespace": "platform"})
    policies = [o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"]
    assert len(policies) == 2
    for policy in policies:
        (condition,) = policy["spec"]["matchConditions"]
        assert condition["expression"] == (
            "request.userInfo.username == 'system:serviceaccount:platform:scheduling-webhook'"
        )
    bindings = {o["spec"]["policyName"]: o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert set(bindings) == {p["metadata"]["name"] for p in policies}
    own = bindings["hopsworks-scheduling-webhook-own-objects"]["spec"]["matchResources"]["namespaceSelector"]
    assert own["matchExpressions"][0]["values"] == ["platform"]
