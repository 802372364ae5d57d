"""Settings guard (G1-G3) and project settings guard: table-driven over every branch.

Requests are shaped like the apiserver's: the envelope of a real AdmissionReview request from
the shared fixtures, with kind/resource/object/oldObject/userInfo replaced.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from webhook.core.decision import Decision
from webhook.core.departments import department_name_error, runai_department_for
from webhook.core.guard import validate_settings_request
from webhook.core.guard_config import GuardConfig, Identities
from webhook.core.namespace_guard import validate_namespace_change
from webhook.core.project_settings import ProjectScheduling, ProjectSettingsError, parse_project_scheduling
from webhook.core.settings_guard import validate_settings_change
from webhook.settings import DEFAULT_RUNAI_URL, ClusterSettings
from webhook.snapshot import ClusterSnapshot, NamespaceInfo, PriorityClassInfo

FIXTURE = (
    Path(__file__).resolve().parents[2] / "shared/fixtures/admissionreview/reqonly-deployment-update-oldobject.json"
)

INSTALLER_SA = "system:serviceaccount:hopsworks:hopsworks-installer"
OWN_SA = "system:serviceaccount:hopsworks:scheduling-webhook"
CONFIG = GuardConfig(
    install_namespace="hopsworks",
    installers=Identities.parse([INSTALLER_SA, "group:hopsworks-installers"]),
    own=Identities.parse([OWN_SA]),
)

SA_GROUPS = ["system:serviceaccounts", "system:serviceaccounts:hopsworks", "system:authenticated"]
INSTALLER = {"username": INSTALLER_SA, "uid": "1", "groups": SA_GROUPS}
INSTALLER_BY_GROUP = {"username": "carol", "groups": ["hopsworks-installers", "system:authenticated"]}
ADMIN = {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]}
OWN = {"username": OWN_SA, "groups": SA_GROUPS}
NS_CONTROLLER = {
    "username": "system:serviceaccount:kube-system:namespace-controller",
    "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
}

SCHEDULER = """\
available:
  affinity: ["nvidia.com/gpu.product=A100", "topology.kubernetes.io/zone=eu-1a"]
  antiAffinity: ["maintenance=true"]
  priorityClasses: ["batch", "normal", "urgent"]
  topologies: {rack: example.com/rack}
project:
  affinity: ["topology.kubernetes.io/zone=eu-1a"]
  antiAffinity: ["maintenance=true"]
  priorityClasses: ["batch", "normal"]
defaults:
  priorityClass: normal
"""
SETTINGS = ClusterSettings.from_configmap_data({"scheduler": SCHEDULER})
RUNAI_ON = ClusterSettings.from_configmap_data({"scheduler": SCHEDULER, "run_ai_enable": "true"})
A100 = "nvidia.com/gpu.product=A100"
ZONE = "topology.kubernetes.io/zone=eu-1a"
MAINT = "maintenance=true"


# -- request builders ------------------------------------------------------------------------


def _envelope() -> dict[str, Any]:
    if FIXTURE.exists():
        envelope = json.loads(FIXTURE.read_text())
    else:  # the same keys as the fixture, for a checkout without ../shared
        envelope = {"uid": "ab41adeb-eca2-4add-9336-c263895d3953", "dryRun": False, "options": {}}
    for key in ("object", "oldObject"):
        envelope.pop(key, None)
    return envelope


ENVELOPE = _envelope()
OPTIONS = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}


def review(
    operation: str,
    kind: str,
    resource: str,
    obj: dict[str, Any] | None,
    old: dict[str, Any] | None,
    user: dict[str, Any],
    dry_run: bool = False,
    name: str | None = None,
    ns: str | None = None,
) -> dict[str, Any]:
    meta = (obj or old or {}).get("metadata") or {}
    name = meta.get("name", "") if name is None else name
    # For a Namespace object the apiserver reports the namespace as its own name.
    ns = meta.get("namespace", name) if ns is None else ns
    request = copy.deepcopy(ENVELOPE)
    gvk = {"group": "", "version": "v1", "kind": kind}
    gvr = {"group": "", "version": "v1", "resource": resource}
    request.update(
        kind=gvk,
        requestKind=gvk,
        resource=gvr,
        requestResource=gvr,
        name=name,
        namespace=ns,
        operation=operation,
        userInfo=copy.deepcopy(user),
        object=obj,
        oldObject=old,
        dryRun=dry_run,
        options={"apiVersion": "meta.k8s.io/v1", "kind": OPTIONS[operation]},
    )
    return request


def configmap(data: dict[str, str], name: str = "hopsworks-cluster-settings", ns: str = "hopsworks") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, "uid": "7d3c", "resourceVersion": "42"},
        "data": data,
    }


def cm_data(**flags: str) -> dict[str, str]:
    # The shipped URL: a CREATE by a non-installer compares against the defaults.
    return {"scheduler": SCHEDULER, "run_ai_url": DEFAULT_RUNAI_URL, **flags}


def cm_request(
    operation: str,
    new: dict[str, str] | None,
    old: dict[str, str] | None,
    user: dict[str, Any],
    name: str = "hopsworks-cluster-settings",
    ns: str = "hopsworks",
    dry_run: bool = False,
) -> dict[str, Any]:
    obj = configmap(new, name, ns) if new is not None else None
    old_obj = configmap(old, name, ns) if old is not None else None
    return review(operation, "ConfigMap", "configmaps", obj, old_obj, user, dry_run, name=name, ns=ns)


def namespace(
    name: str = "proj1",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    project: bool = True,
) -> dict[str, Any]:
    all_labels = {"kubernetes.io/metadata.name": name, **({"hopsworks.ai/project": "119"} if project else {})}
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "uid": "0b1e",
            "resourceVersion": "7",
            "labels": {**all_labels, **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def ns_request(
    operation: str, new: dict | None, old: dict | None = None, user: dict[str, Any] = ADMIN
) -> dict[str, Any]:
    return review(operation, "Namespace", "namespaces", new, old, user)


def snapshot(
    settings: ClusterSettings = SETTINGS,
    bound: tuple[str, ...] = (),
    priority_classes: tuple[str, ...] = (),
    install_ns_deleting: bool = False,
) -> ClusterSnapshot:
    namespaces = {
        "hopsworks": NamespaceInfo("hopsworks", deleting=install_ns_deleting),
        "kube-system": NamespaceInfo("kube-system"),
    }
    for name in bound:
        namespaces[name] = NamespaceInfo(name, labels={"hopsworks.ai/project": "1", "runai/queue": name})
    return ClusterSnapshot(
        settings=settings,
        namespaces=namespaces,
        priority_classes={n: PriorityClassInfo(n, 1000) for n in priority_classes},
    )


def check(decision: Decision, allowed: bool, code: int, contains: tuple[str, ...], warns: tuple[str, ...]) -> None:
    assert decision.allowed is allowed, decision
    if not allowed:
        assert decision.code == code, decision
        assert decision.reason == ("Invalid" if code == 422 else "Forbidden")
    for text in contains:
        assert text in decision.message, (text, decision.message)
    joined = "\n".join(decision.warnings)
    for text in warns:
        assert text in joined, (text, decision.warnings)
    if not warns:
        assert decision.warnings == (), decision.warnings


# -- settings ConfigMap ----------------------------------------------------------------------

BOTH = cm_data(kueue_installed="true", run_ai_enable="true")
OFF = cm_data(run_ai_enable="false")
ON = cm_data(run_ai_enable="true")
KUEUE = cm_data(kueue_installed="true")
TWELVE = tuple(f"p{i:02d}" for i in range(12))

SETTINGS_CASES = [
    # (id, operation, new, old, user, snapshot, allowed, code, message contains, warnings contain)
    ("other-configmap-name", "UPDATE", BOTH, OFF, ADMIN, {"name": True}, True, 0, (), ()),
    ("other-namespace", "UPDATE", BOTH, OFF, ADMIN, {"ns": "default"}, True, 0, (), ()),
    ("other-key-changed-by-anyone", "UPDATE", cm_data(run_ai_project_gpu_quota="2"), OFF, ADMIN, {}, True, 0, (), ()),
    ("invalid-yaml-in-scheduler", "UPDATE", cm_data(scheduler="available: [unclosed"), OFF, INSTALLER, {},
     False, 422, ("scheduler: not valid YAML",), ()),
    ("unknown-scheduler-key", "UPDATE", cm_data(scheduler="availabel: {}"), OFF, ADMIN, {},
     False, 422, ("availabel",), ()),
    ("project-outside-available", "UPDATE", cm_data(scheduler="project: {priorityClasses: [gold]}"), OFF, ADMIN,
     {}, False, 422, ("gold",), ()),
    ("bad-flag-value", "CREATE", cm_data(run_ai_enable="maybe"), None, INSTALLER, {},
     False, 422, ("run_ai_enable",), ()),
    ("g1-both-on-update-even-installer", "UPDATE", BOTH, ON, INSTALLER, {},
     False, 403, ("cannot both be true",), ()),
    ("g1-both-on-create", "CREATE", BOTH, None, INSTALLER, {}, False, 403, ("cannot both be true",), ()),
    ("g2-enable-by-admin", "UPDATE", ON, OFF, ADMIN, {},
     False, 403, ("run_ai_enable (false->true)", "helm upgrade", "kubernetes-admin"), ()),
    ("g2-enable-by-installer-sa", "UPDATE", ON, OFF, INSTALLER, {}, True, 0, (), ()),
    ("g2-enable-by-installer-group", "UPDATE", ON, OFF, INSTALLER_BY_GROUP, {}, True, 0, (), ()),
    ("g2-enable-by-own-identity", "UPDATE", ON, OFF, OWN, {}, False, 403, ("installation",), ()),
    ("g2-disable-by-admin", "UPDATE", OFF, ON, ADMIN, {}, False, 403, ("true->false",), ()),
    ("g2-disable-by-installer-warns-bound", "UPDATE", OFF, ON, INSTALLER, {"bound": ("p1", "p2")},
     True, 0, (), ("RUN_AI_BINDING_LEFT", "p1, p2")),
    ("g2-disable-key-removed", "UPDATE", cm_data(), ON, ADMIN, {}, False, 403, ("true->false",), ()),
    ("g2-create-on-by-admin", "CREATE", ON, None, ADMIN, {}, False, 403, ("false->true",), ()),
    # An absent ConfigMap means the defaults, whatever a lagging cache still holds.
    ("g2-create-compares-to-defaults", "CREATE", ON, None, ADMIN, {"settings": RUNAI_ON},
     False, 403, ("false->true",), ()),
    ("g2-create-on-by-installer", "CREATE", ON, None, INSTALLER, {}, True, 0, (), ()),
    ("g2-create-off-by-admin", "CREATE", OFF, None, ADMIN, {}, True, 0, (), ()),
    ("g2-unchanged-on-other-key", "UPDATE", cm_data(run_ai_enable="true", run_ai_project_gpu_quota="1"), ON,
     ADMIN, {}, True, 0, (), ()),
    ("g2-unchanged-spelling-differs", "UPDATE", cm_data(run_ai_enable="True"), ON, ADMIN, {}, True, 0, (), ()),
    ("g2-fix-broken-old-keeps-flag", "UPDATE", ON, cm_data(run_ai_enable="true", scheduler="x: ["), ADMIN, {},
     True, 0, (), ()),
    ("g2-fix-broken-old-flips-flag", "UPDATE", OFF, cm_data(run_ai_enable="true", scheduler="x: ["), ADMIN, {},
     False, 403, ("true->false",), ()),
    ("g2-no-installers-configured", "UPDATE", ON, OFF, INSTALLER, {"config": GuardConfig()},
     False, 403, ("no installer identities are configured",), ()),
    ("g2-dry-run-judged-the-same", "UPDATE", ON, OFF, ADMIN, {"dry_run": True}, False, 403, ("helm",), ()),
    ("g3-kueue-on-with-bound", "UPDATE", KUEUE, OFF, ADMIN, {"bound": ("zeta", "alpha")},
     False, 403, ("alpha, zeta", "runai/queue", "hopsworks.ai/runai-project-id", "delete its Run:ai project"), ()),
    ("g3-kueue-on-capped", "UPDATE", KUEUE, OFF, ADMIN, {"bound": TWELVE},
     False, 403, ("p00, p01, p02, p03, p04, p05, p06, p07, p08, p09 and 2 more",), ()),
    ("g3-kueue-on-by-installer-too", "UPDATE", KUEUE, OFF, INSTALLER, {"bound": ("p1",)}, False, 403, ("p1",), ()),
    ("g3-kueue-on-create", "CREATE", KUEUE, None, ADMIN, {"bound": ("p1",)}, False, 403, ("p1",), ()),
    ("g3-kueue-on-nothing-bound", "UPDATE", KUEUE, OFF, ADMIN, {}, True, 0, (), ()),
    ("g3-kueue-already-on", "UPDATE", cm_data(kueue_installed="true", run_ai_project_gpu_quota="1"), KUEUE, ADMIN,
     {"bound": ("p1",)}, True, 0, (), ()),
    ("g3-kueue-off-with-bound", "UPDATE", OFF, KUEUE, ADMIN, {"bound": ("p1",)}, True, 0, (), ()),
    ("delete-while-runai-off", "DELETE", None, KUEUE, ADMIN, {}, True, 0, (), ()),
    ("delete-while-runai-on-by-admin", "DELETE", None, ON, ADMIN, {},
     False, 403, ("deleting the settings would change run_ai_enable (true->false)",), ()),
    ("delete-while-runai-on-by-installer", "DELETE", None, ON, INSTALLER, {}, True, 0, (), ()),
    ("delete-with-install-namespace", "DELETE", None, ON, NS_CONTROLLER, {"ns_deleting": True}, True, 0, (), ()),
    ("delete-no-oldobject-uses-cache", "DELETE", None, None, ADMIN, {"settings": RUNAI_ON},
     False, 403, ("true->false",), ()),
    ("delete-no-oldobject-runai-off", "DELETE", None, None, ADMIN, {}, True, 0, (), ()),
    # Where the Run:ai client secret goes, and which one: the installation's, like run_ai_enable.
    ("url-by-admin", "UPDATE", cm_data(run_ai_url="https://attacker.example"), OFF, ADMIN, {},
     False, 403, ("cannot change run_ai_url", "helm upgrade", "kubernetes-admin"), ()),
    ("url-by-admin-runai-on", "UPDATE", cm_data(run_ai_enable="true", run_ai_url="https://x.example"), ON, ADMIN,
     {}, False, 403, ("run_ai_url",), ()),
    ("client-id-by-admin", "UPDATE", cm_data(run_ai_client_id="other"), OFF, ADMIN, {},
     False, 403, ("run_ai_client_id",), ()),
    ("secret-ref-by-admin", "UPDATE",
     cm_data(run_ai_client_secret_name="mine", run_ai_client_secret_key="k"), OFF, ADMIN, {},
     False, 403, ("run_ai_client_secret_name, run_ai_client_secret_key",), ()),
    ("url-on-create-by-admin", "CREATE", cm_data(run_ai_url="https://attacker.example"), None, ADMIN, {},
     False, 403, ("run_ai_url",), ()),
    ("url-by-own-identity", "UPDATE", cm_data(run_ai_url="https://x.example"), OFF, OWN, {},
     False, 403, ("run_ai_url",), ()),
    ("url-no-installers-configured", "UPDATE", cm_data(run_ai_url="https://x.example"), OFF, INSTALLER,
     {"config": GuardConfig()}, False, 403, ("no installer identities are configured",), ()),
    ("url-by-installer", "UPDATE", cm_data(run_ai_url="https://runai.other:8080"), OFF, INSTALLER, {},
     True, 0, (), ()),
    ("url-unchanged-other-key-by-admin", "UPDATE", cm_data(run_ai_project_gpu_quota="3"), OFF, ADMIN, {},
     True, 0, (), ()),
    ("url-kept-fixing-broken-old", "UPDATE", OFF, cm_data(scheduler="x: ["), ADMIN, {}, True, 0, (), ()),
    ("url-reset-by-delete", "DELETE", None, cm_data(run_ai_url="https://runai.other:8080"), ADMIN, {},
     True, 0, (), ()),
]  # fmt: skip


@pytest.mark.parametrize(
    ("operation", "new", "old", "user", "opts", "allowed", "code", "contains", "warns"),
    [pytest.param(*case[1:], id=case[0]) for case in SETTINGS_CASES],
)
def test_settings_guard(
    operation: str,
    new: dict[str, str] | None,
    old: dict[str, str] | None,
    user: dict[str, Any],
    opts: dict[str, Any],
    allowed: bool,
    code: int,
    contains: tuple[str, ...],
    warns: tuple[str, ...],
) -> None:
    name = "other-settings" if opts.get("name") else "hopsworks-cluster-settings"
    request = cm_request(operation, new, old, user, name=name, ns=opts.get("ns", "hopsworks"))
    request["dryRun"] = bool(opts.get("dry_run"))
    snap = snapshot(
        settings=opts.get("settings", SETTINGS),
        bound=opts.get("bound", ()),
        install_ns_deleting=bool(opts.get("ns_deleting")),
    )
    decision = validate_settings_change(request, snap, opts.get("config", CONFIG))
    check(decision, allowed, code, contains, warns)
    # The HTTP layer goes through the dispatcher: it must answer the same.
    assert validate_settings_request(request, snap, opts.get("config", CONFIG)) == decision


def test_other_configmap_name_is_not_judged() -> None:
    request = cm_request("UPDATE", BOTH, OFF, ADMIN, name="something-else")
    assert validate_settings_change(request, snapshot(), CONFIG).allowed


def test_settings_change_is_audited() -> None:
    decision = validate_settings_change(cm_request("UPDATE", ON, OFF, INSTALLER), snapshot(), CONFIG)
    assert decision.audit == {"run-ai-enable": "false->true"}
    decision = validate_settings_change(cm_request("UPDATE", KUEUE, OFF, ADMIN), snapshot(), CONFIG)
    assert decision.audit == {"kueue-installed": "false->true"}


def test_identities_parse_and_match() -> None:
    ids = Identities.parse([" alice ", "group:ops", ""])
    assert ids == Identities(frozenset({"alice"}), frozenset({"ops"}))
    assert ids.matches({"username": "alice"})
    assert ids.matches({"username": "bob", "groups": ["ops"]})
    assert not ids.matches({"username": "bob", "groups": ["dev"]})
    assert not ids.matches(None)
    assert not Identities()


def test_other_kinds_pass() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "hopsworks"}}
    request = review("CREATE", "Pod", "pods", pod, None, ADMIN)
    assert validate_settings_request(request, snapshot(), CONFIG).allowed


# -- project namespace annotations -----------------------------------------------------------

AV = "scheduling.hopsworks.ai/available"
DF = "scheduling.hopsworks.ai/defaults"


def js(value: Any) -> str:
    return json.dumps(value)


ANNOTATION_CASES = [
    # (id, annotations, known priority classes, allowed, message contains)
    ("none", {}, (), True, ()),
    ("valid-both", {AV: js({"affinity": [A100], "priorityClasses": ["urgent"], "queues": ["gpu"]}),
                    DF: js({"affinity": [A100], "priorityClass": "urgent", "queue": "gpu", "topology": "rack"})},
     (), True, ()),
    ("empty-annotation-is-unset", {AV: "", DF: " "}, (), True, ()),
    ("null-is-unset", {DF: js({"priorityClass": None})}, (), True, ()),
    ("available-bad-json", {AV: "{affinity: [}"}, (), False, (AV, "not valid JSON", "line 1")),
    ("available-not-object", {AV: js([A100])}, (), False, (AV, "must be a JSON object, got list")),
    ("available-unknown-key", {AV: js({"gpus": 2})}, (), False,
     ("unknown keys 'gpus'", "'affinity', 'antiAffinity', 'priorityClasses', 'queues'")),
    ("available-python-name-key", {AV: js({"anti_affinity": [MAINT]})}, (), False, ("unknown keys 'anti_affinity'",)),
    ("available-affinity-not-list", {AV: js({"affinity": A100})}, (), False, ("affinity must be a list",)),
    ("available-affinity-non-string", {AV: js({"affinity": [1]})}, (), False, ("affinity must be a list",)),
    ("available-label-not-offered", {AV: js({"affinity": ["gpu=h100"]})}, (), False,
     ("affinity label 'gpu=h100' is not offered", f"'{A100}', '{ZONE}'")),
    ("available-anti-label-not-offered", {AV: js({"antiAffinity": ["spot=true"]})}, (), False,
     ("antiAffinity label 'spot=true'", "'maintenance=true'")),
    ("available-pc-not-offered", {AV: js({"priorityClasses": ["gold"]})}, (), False,
     ("priority class 'gold' is not offered", "'batch', 'normal', 'urgent'")),
    ("available-pc-missing-in-cluster", {AV: js({"priorityClasses": ["urgent"]})}, ("batch", "normal"), False,
     ("PriorityClass 'urgent' does not exist",)),
    ("available-pc-exists-in-cluster", {AV: js({"priorityClasses": ["urgent"]})}, ("urgent",), True, ()),
    ("available-bad-queue-name", {AV: js({"queues": ["GPU_Queue"]})}, (), False, ("not a valid queue name",)),
    ("defaults-bad-json", {DF: "priorityClass=high"}, (), False, (DF, "not valid JSON")),
    ("defaults-not-object", {DF: js("urgent")}, (), False, ("must be a JSON object, got str",)),
    ("defaults-unknown-key", {DF: js({"priorityClasses": ["batch"]})}, (), False,
     ("unknown keys 'priorityClasses'", "'priorityClass', 'queue', 'topology'")),
    ("defaults-pc-wrong-type", {DF: js({"priorityClass": 5})}, (), False,
     ("priorityClass must be a non-empty string",)),
    ("defaults-affinity-wrong-type", {DF: js({"affinity": ZONE})}, (), False, ("affinity must be a list",)),
    ("defaults-pc-outside-cluster-project", {DF: js({"priorityClass": "urgent"})}, (), False,
     ("priorityClass 'urgent' is outside", "'batch', 'normal'", "the cluster's scheduler.project")),
    ("defaults-pc-outside-own-available", {AV: js({"priorityClasses": ["batch"]}), DF: js({"priorityClass": "normal"})},
     (), False, ("'normal' is outside", "('batch', from its scheduling.hopsworks.ai/available")),
    ("defaults-pc-missing-in-cluster", {DF: js({"priorityClass": "batch"})}, ("normal",), False,
     ("PriorityClass 'batch' does not exist",)),
    ("defaults-affinity-outside", {DF: js({"affinity": [A100]})}, (), False,
     (f"affinity label '{A100}' is outside", f"'{ZONE}'")),
    ("defaults-anti-inside", {DF: js({"antiAffinity": [MAINT]})}, (), True, ()),
    ("defaults-topology-unknown", {DF: js({"topology": "datacenter"})}, (), False,
     ("topology 'datacenter' is not a topology unit", "'host', 'rack', 'region', 'zone'")),
    ("defaults-topology-admin-unit", {DF: js({"topology": "rack"})}, (), True, ()),
    ("defaults-queue-outside", {AV: js({"queues": ["a"]}), DF: js({"queue": "b"})}, (), False,
     ("queue 'b' is outside the project's available queues ('a')",)),
    ("defaults-queue-unrestricted", {DF: js({"queue": "team-a"})}, (), True, ()),
    ("defaults-queue-bad-name", {DF: js({"queue": "Team A"})}, (), False, ("not a valid queue name",)),
    ("several-errors-reported", {AV: js({"affinity": ["x=y"]}), DF: js({"topology": "dc"})}, (), False,
     ("'x=y'", "'dc'")),
]  # fmt: skip


@pytest.mark.parametrize(
    ("annotations", "known_pcs", "allowed", "contains"),
    [pytest.param(*case[1:], id=case[0]) for case in ANNOTATION_CASES],
)
@pytest.mark.parametrize("operation", ["CREATE", "UPDATE"])
def test_annotations_validated_when_written(
    operation: str,
    annotations: dict[str, str],
    known_pcs: tuple[str, ...],
    allowed: bool,
    contains: tuple[str, ...],
) -> None:
    new = namespace(annotations=annotations)
    old = namespace() if operation == "UPDATE" else None
    decision = validate_namespace_change(ns_request(operation, new, old), snapshot(priority_classes=known_pcs), CONFIG)
    check(decision, allowed, 422, contains, ())


def test_annotations_not_judged_on_non_project_namespaces() -> None:
    new = namespace(name="kube-public", annotations={AV: "{"}, project=False)
    assert validate_namespace_change(ns_request("CREATE", new), snapshot(), CONFIG).allowed


STALE = {AV: js({"affinity": [A100, "gpu=v100"]}), DF: js({"topology": "rack"})}
SHRUNK = ClusterSettings.from_configmap_data(
    {"scheduler": SCHEDULER.replace("topologies: {rack: example.com/rack}", "")}
)

STALE_CASES = [
    # (id, old annotations, new annotations, settings, allowed, message contains, warnings contain)
    ("unchanged-stale-label-edit-warns", STALE, STALE, SHRUNK, True, (),
     ("'gpu=v100' is not offered", "topology 'rack'")),
    ("unchanged-broken-json-warns", {AV: "{"}, {AV: "{"}, SETTINGS, True, (), ("not valid JSON",)),
    ("unchanged-valid-no-warning", {DF: js({"priorityClass": "batch"})}, {DF: js({"priorityClass": "batch"})}, SETTINGS,
     True, (), ()),
    ("available-shrunk-below-defaults", {DF: js({"priorityClass": "normal"})},
     {AV: js({"priorityClasses": ["batch"]}), DF: js({"priorityClass": "normal"})}, SETTINGS, False,
     ("priorityClass 'normal' is outside",), ()),
    ("defaults-written-stale-available-lenient", {AV: js({"affinity": [A100, "gpu=v100"]})},
     {AV: js({"affinity": [A100, "gpu=v100"]}), DF: js({"affinity": [A100]})}, SETTINGS, True, (),
     ("ignored by pod admission", "'gpu=v100' is not offered")),
    ("defaults-written-on-broken-available", {AV: "{"}, {AV: "{", DF: js({"priorityClass": "batch"})}, SETTINGS, False,
     ("not valid JSON",), ()),
    ("defaults-removed", {DF: js({"topology": "zone"})}, {}, SETTINGS, True, (), ()),
]  # fmt: skip


@pytest.mark.parametrize(
    ("old_ann", "new_ann", "settings", "allowed", "contains", "warns"),
    [pytest.param(*case[1:], id=case[0]) for case in STALE_CASES],
)
def test_only_written_annotations_are_judged_strictly(
    old_ann: dict[str, str],
    new_ann: dict[str, str],
    settings: ClusterSettings,
    allowed: bool,
    contains: tuple[str, ...],
    warns: tuple[str, ...],
) -> None:
    old = namespace(annotations=old_ann)
    new = namespace(annotations=new_ann, labels={"team": "x"})
    decision = validate_namespace_change(ns_request("UPDATE", new, old), snapshot(settings), CONFIG)
    check(decision, allowed, 422, contains, warns)


# -- department names ------------------------------------------------------------------------

DEPARTMENT_NAMES = [
    ("a", True),
    ("default", True),
    ("data-science", True),
    ("team-42", True),
    ("7", True),
    ("a" * 63, True),
    ("a" * 64, False),
    ("-team", False),
    ("team-", False),
    ("Team", False),
    ("data_science", False),
    ("data.science", False),
    ("dé", False),
    ("a b", False),
]


@pytest.mark.parametrize(("name", "valid"), DEPARTMENT_NAMES, ids=[f"{n[:12]}-{len(n)}" for n, _ in DEPARTMENT_NAMES])
def test_department_naming_rule(name: str, valid: bool) -> None:
    assert (department_name_error(name) is None) is valid
    decision = validate_namespace_change(
        ns_request("CREATE", namespace(labels={"hopsworks.ai/department": name})), snapshot(), CONFIG
    )
    assert decision.allowed is valid
    if not valid:
        assert decision.code == 422
        assert "up to 63 lowercase letters" in decision.message


def test_existing_invalid_department_is_not_rejudged() -> None:
    old = namespace(labels={"hopsworks.ai/department": "Legacy_Dept"})
    new = namespace(labels={"hopsworks.ai/department": "Legacy_Dept", "team": "x"})
    assert validate_namespace_change(ns_request("UPDATE", new, old), snapshot(), CONFIG).allowed


# -- department edits on bound namespaces ----------------------------------------------------

CREATED = {"runai/queue": "proj1", "hopsworks.ai/runai-project-id": "4711"}
ADOPTED = {"runai/queue": "proj1"}
KNOWN = frozenset({"default", "research", "vision"})
D = "hopsworks.ai/department"

MOVE_CASES = [
    # (id, old labels, new labels, runai departments, settings, user, allowed, message contains, warnings)
    ("created-move-refused", {**CREATED, D: "research"}, {**CREATED, D: "vision"}, KNOWN, RUNAI_ON, ADMIN, False,
     ("research to vision", "POST /api/v1/admin/projects/proj1/move", '{"department": "vision"}',
      "scheduling-webhook admin move-project proj1 vision"), ()),
    ("created-label-added-refused", CREATED, {**CREATED, D: "vision"}, KNOWN, RUNAI_ON, ADMIN, False,
     ("from (default) to vision", "from Run:ai department default to vision"), ()),
    ("created-label-removed-refused", {**CREATED, D: "vision"}, CREATED, KNOWN, RUNAI_ON, ADMIN, False,
     ("move-project proj1 default",), ()),
    ("created-same-runai-dept", {**CREATED, D: "finance"}, {**CREATED, D: "legal"}, KNOWN, RUNAI_ON, ADMIN, True,
     (), ()),
    ("created-to-unmapped-from-default", CREATED, {**CREATED, D: "legal"}, KNOWN, RUNAI_ON, ADMIN, True, (), ()),
    ("created-unknown-depts-refused", {**CREATED, D: "finance"}, {**CREATED, D: "legal"}, None, RUNAI_ON, ADMIN,
     False, ("not known yet",), ()),
    ("created-unknown-depts-both-default", CREATED, {**CREATED, D: "default"}, None, RUNAI_ON, ADMIN, True, (), ()),
    ("created-own-identity-allowed", {**CREATED, D: "research"}, {**CREATED, D: "vision"}, KNOWN, RUNAI_ON, OWN,
     True, (), ()),
    ("created-runai-off-warns", {**CREATED, D: "research"}, {**CREATED, D: "vision"}, KNOWN, SETTINGS, ADMIN,
     True, (), ("Run:ai is off",)),
    ("created-labels-dropped-same-edit", {**CREATED, D: "research"}, {D: "vision"}, KNOWN, RUNAI_ON, ADMIN, False,
     ("admin move",), ("runai/queue removed",)),
    ("adopted-allowed-warns-drift", {**ADOPTED, D: "research"}, {**ADOPTED, D: "vision"}, KNOWN, RUNAI_ON, ADMIN,
     True, (), ("RUN_AI_DEPARTMENT_DRIFT",)),
    ("adopted-same-runai-dept-silent", {**ADOPTED, D: "finance"}, {**ADOPTED, D: "legal"}, KNOWN, RUNAI_ON, ADMIN,
     True, (), ()),
    ("unbound-allowed", {D: "research"}, {D: "vision"}, KNOWN, RUNAI_ON, ADMIN, True, (), ()),
    ("unchanged-department", {**CREATED, D: "research"}, {**CREATED, D: "research", "x": "y"}, None, RUNAI_ON,
     ADMIN, True, (), ()),
    ("invalid-and-move-both-reported", {**CREATED, D: "research"}, {**CREATED, D: "Vision"}, KNOWN, RUNAI_ON,
     ADMIN, False, ("admin move", "not a valid name"), ()),
    # Leaving Run:ai: removing the binding labels is allowed; while Run:ai is on, say what follows.
    ("remove-binding-runai-on-warns", CREATED, {}, None, RUNAI_ON, ADMIN, True, (),
     ("bound again", "no longer deletes or moves")),
    ("remove-binding-runai-off-silent", CREATED, {}, None, SETTINGS, ADMIN, True, (), ()),
    ("remove-binding-own-silent", CREATED, {}, None, RUNAI_ON, OWN, True, (), ()),
    ("change-queue-warns", CREATED, {**CREATED, "runai/queue": "other"}, None, RUNAI_ON, ADMIN, True, (),
     ("runai/queue changed",)),
    ("add-project-id-refused", ADOPTED, CREATED, None, RUNAI_ON, ADMIN, False, ("set only by this system",), ()),
    ("repoint-project-id-refused", CREATED, {**CREATED, "hopsworks.ai/runai-project-id": "9"}, None, SETTINGS,
     ADMIN, False, ("set only by this system",), ()),
    ("add-project-id-own-allowed", ADOPTED, CREATED, None, RUNAI_ON, OWN, True, (), ()),
]  # fmt: skip


@pytest.mark.parametrize(
    ("old_labels", "new_labels", "departments", "settings", "user", "allowed", "contains", "warns"),
    [pytest.param(*case[1:], id=case[0]) for case in MOVE_CASES],
)
def test_department_edit_and_binding_labels(
    old_labels: dict[str, str],
    new_labels: dict[str, str],
    departments: frozenset[str] | None,
    settings: ClusterSettings,
    user: dict[str, Any],
    allowed: bool,
    contains: tuple[str, ...],
    warns: tuple[str, ...],
) -> None:
    request = ns_request("UPDATE", namespace(labels=new_labels), namespace(labels=old_labels), user)
    decision = validate_namespace_change(request, snapshot(settings), CONFIG, departments)
    check(decision, allowed, 403, contains, warns)
    assert validate_settings_request(request, snapshot(settings), CONFIG, departments) == decision


PROJECT_REMOVAL_CASES = [
    # (id, old labels, user, allowed, message contains)
    ("unbound-by-admin", {}, ADMIN, False, ("hopsworks.ai/project cannot be removed from proj1", "kubernetes-admin")),
    ("bound-by-admin", CREATED, ADMIN, False, ("bound to Run:ai project proj1", "GPU quota")),
    ("by-installer", CREATED, INSTALLER, True, ()),
    ("by-own-identity", CREATED, OWN, True, ()),
]


@pytest.mark.parametrize(
    ("old_labels", "user", "allowed", "contains"),
    [pytest.param(*case[1:], id=case[0]) for case in PROJECT_REMOVAL_CASES],
)
def test_removing_the_project_label_is_refused_but_to_the_installation(
    old_labels: dict[str, str], user: dict[str, Any], allowed: bool, contains: tuple[str, ...]
) -> None:
    new = namespace(labels=old_labels)
    del new["metadata"]["labels"]["hopsworks.ai/project"]
    request = ns_request("UPDATE", new, namespace(labels=old_labels), user)
    decision = validate_settings_request(request, snapshot(RUNAI_ON), CONFIG)
    check(decision, allowed, 403, contains, ("no longer a project namespace",) if allowed else ())
    if allowed:
        assert decision.audit == {"project-label-removed": "proj1"}


def test_create_with_binding_labels_allowed() -> None:
    # A namespace restored from a backup keeps its labels.
    request = ns_request("CREATE", namespace(labels={**CREATED, D: "vision"}))
    assert validate_namespace_change(request, snapshot(RUNAI_ON), CONFIG, KNOWN).allowed


def test_namespace_delete_allowed() -> None:
    request = ns_request("DELETE", None, namespace(labels=CREATED))
    assert validate_namespace_change(request, snapshot(RUNAI_ON), CONFIG).allowed


@pytest.mark.parametrize(
    ("department", "departments", "expected"),
    [
        (None, None, "default"),
        ("default", None, "default"),
        ("vision", None, None),
        ("vision", KNOWN, "vision"),
        ("legal", KNOWN, "default"),
        (None, frozenset(), "default"),
    ],
    ids=["absent", "default-name", "unknown", "known", "unmapped", "absent-empty-cache"],
)
def test_runai_department_for(department: str | None, departments: frozenset[str] | None, expected: str | None) -> None:
    assert runai_department_for(department, SETTINGS, departments) == expected


# -- parse_project_scheduling ----------------------------------------------------------------

NO_PROJECT = ClusterSettings.from_configmap_data(
    {"scheduler": "available: {affinity: ['a=1', 'b=2'], priorityClasses: [batch, urgent]}\n"
     "defaults: {priorityClass: urgent, affinity: ['b=2'], queue: main, topology: zone}"}
)  # fmt: skip

PARSE_CASES = [
    # (id, annotations, settings, expected)
    ("cluster-project-subset", {}, SETTINGS,
     ProjectScheduling(affinity=(ZONE,), anti_affinity=(MAINT,), priority_classes=("batch", "normal"),
                       default_priority_class="normal")),
    ("no-project-subset-means-all", {}, NO_PROJECT,
     ProjectScheduling(affinity=("a=1", "b=2"), priority_classes=("batch", "urgent"), default_affinity=("b=2",),
                       default_priority_class="urgent", default_queue="main", default_topology="zone")),
    ("override-one-key-keeps-others", {AV: js({"priorityClasses": ["urgent", "urgent"]})}, SETTINGS,
     ProjectScheduling(affinity=(ZONE,), anti_affinity=(MAINT,), priority_classes=("urgent",))),
    ("project-defaults-win", {AV: js({"affinity": [A100, ZONE], "queues": ["q1", "q2"]}),
                              DF: js({"affinity": [A100], "antiAffinity": [], "priorityClass": "batch",
                                      "queue": "q2", "topology": "host"})}, SETTINGS,
     ProjectScheduling(affinity=(A100, ZONE), anti_affinity=(MAINT,), priority_classes=("batch", "normal"),
                       queues=("q1", "q2"), default_affinity=(A100,), default_priority_class="batch",
                       default_queue="q2", default_topology="host",
                       project_defaults=frozenset({"affinity", "antiAffinity", "priorityClass", "queue", "topology"}))),
    ("explicit-empty-affinity-clears-cluster-default", {DF: js({"affinity": []})}, NO_PROJECT,
     ProjectScheduling(affinity=("a=1", "b=2"), priority_classes=("batch", "urgent"), default_priority_class="urgent",
                       default_queue="main", default_topology="zone", project_defaults=frozenset({"affinity"}))),
    ("cluster-default-queue-outside-project-queues", {AV: js({"queues": ["other"]})}, NO_PROJECT,
     ProjectScheduling(affinity=("a=1", "b=2"), priority_classes=("batch", "urgent"), queues=("other",),
                       default_affinity=("b=2",), default_priority_class="urgent", default_topology="zone")),
    ("stale-values-dropped-with-notes", {AV: js({"affinity": ["gone=1", A100]}), DF: js({"affinity": ["gone=1"],
                                         "topology": "dc", "priorityClass": "urgent"})}, SETTINGS,
     ProjectScheduling(affinity=(A100,), anti_affinity=(MAINT,), priority_classes=("batch", "normal"),
                       default_priority_class="normal", project_defaults=frozenset({"affinity"}),
                       notes=("scheduling.hopsworks.ai/available: affinity label 'gone=1' is not offered by the "
                              f"cluster (available.affinity: '{A100}', '{ZONE}')",
                              "scheduling.hopsworks.ai/defaults: affinity label 'gone=1' is outside the "
                              f"project's available affinity ('{A100}', from its scheduling.hopsworks.ai/available "
                              "annotation)",
                              "scheduling.hopsworks.ai/defaults: priorityClass 'urgent' is outside the project's "
                              "available priorityClasses ('batch', 'normal', from the cluster's scheduler.project)",
                              "scheduling.hopsworks.ai/defaults: topology 'dc' is not a topology unit of the "
                              "cluster ('host', 'rack', 'region', 'zone')"))),
]  # fmt: skip


@pytest.mark.parametrize(
    ("annotations", "settings", "expected"), [pytest.param(*case[1:], id=case[0]) for case in PARSE_CASES]
)
def test_parse_project_scheduling(
    annotations: dict[str, str], settings: ClusterSettings, expected: ProjectScheduling
) -> None:
    ns = NamespaceInfo("proj1", labels={"hopsworks.ai/project": "1"}, annotations=annotations)
    assert parse_project_scheduling(ns, settings) == expected
    if expected.notes:
        with pytest.raises(ProjectSettingsError):
            parse_project_scheduling(ns, settings, strict=True)
    else:
        assert parse_project_scheduling(ns, settings, strict=True) == expected


@pytest.mark.parametrize(
    ("annotations", "match"),
    [
        ({AV: "[1"}, "not valid JSON"),
        ({DF: js({"queue": 3})}, "queue must be a non-empty string"),
        ({DF: js({"priorityClass": ""})}, "priorityClass must be a non-empty string"),
        ({AV: js({"queues": "q1"})}, "queues must be a list"),
        ({DF: js({"colour": "red"})}, "unknown keys 'colour'"),
    ],
    ids=["bad-json", "queue-int", "empty-pc", "queues-string", "unknown-key"],
)
def test_parse_project_scheduling_malformed_always_raises(annotations: dict[str, str], match: str) -> None:
    ns = NamespaceInfo("proj1", labels={"hopsworks.ai/project": "1"}, annotations=annotations)
    with pytest.raises(ProjectSettingsError, match=match):
        parse_project_scheduling(ns, SETTINGS)


def test_parse_project_scheduling_checks_existing_priority_classes() -> None:
    ns = NamespaceInfo(
        "p", annotations={AV: js({"priorityClasses": ["batch", "urgent"]}), DF: js({"priorityClass": "urgent"})}
    )
    lenient = parse_project_scheduling(ns, SETTINGS, existing_priority_classes={"batch"})
    assert lenient.priority_classes == ("batch",)
    assert lenient.default_priority_class is None  # cluster default "normal" is outside the subset
    assert len(lenient.notes) == 2
    with pytest.raises(ProjectSettingsError, match="PriorityClass 'urgent' does not exist"):
        parse_project_scheduling(ns, SETTINGS, strict=True, existing_priority_classes={"batch"})


MOVE = {"scheduling.hopsworks.ai/runai-move": '{"v":1,"phase":"deleted"}'}


@pytest.mark.parametrize(
    ("old_annotations", "new_annotations", "user", "allowed"),
    [
        pytest.param({}, MOVE, ADMIN, False, id="add-intent-refused"),
        pytest.param(MOVE, {}, ADMIN, False, id="clear-intent-refused"),
        pytest.param(MOVE, {"scheduling.hopsworks.ai/runai-move": "{}"}, ADMIN, False, id="edit-intent-refused"),
        pytest.param({}, MOVE, OWN, True, id="own-identity-writes-intent"),
        pytest.param(MOVE, MOVE, ADMIN, True, id="unchanged-intent-allowed"),
    ],
)
def test_move_intent_is_written_only_by_this_system(
    old_annotations: dict[str, str], new_annotations: dict[str, str], user: dict[str, Any], allowed: bool
) -> None:
    request = ns_request(
        "UPDATE",
        namespace(labels=CREATED, annotations=new_annotations),
        namespace(labels=CREATED, annotations=old_annotations),
        user,
    )
    decision = validate_namespace_change(request, snapshot(RUNAI_ON), CONFIG, KNOWN)
    assert decision.allowed is allowed, decision.message
    if not allowed:
        assert "admin move API" in decision.message
