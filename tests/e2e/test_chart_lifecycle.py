"""The chart's whole life with the real helm, on a control plane of its own (the session's keeps its
install): `helm install` gives webhooks that answer and mutate; `helm upgrade` with changed values
changes the settings and rolls the pods while a loop creating pods sees no refusal; `helm rollback`
brings the old settings back; the CA never changes; the Kueue + Run:ai conflict and a bad value fail
install and upgrade with their message and change nothing; `helm uninstall` leaves project
namespaces that delete, and nothing of the chart's but what is listed as left on purpose.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import Cluster, _report, own_control_plane
from tests.support import chart, peers
from tests.support.control_plane.cluster import ControlPlane
from tests.support.control_plane.install import (
    INSTALL_NS,
    RUNAI_NAMESPACE,
    SETTINGS,
    TLS_SECRET,
    Install,
    helm,
    helm_install,
    installed,
)
from tests.support.control_plane.nodes import REAL_NODE_TAINT, image_archive
from tests.support.control_plane.rest import Rest
from tests.support.pod_creations import Creations
from webhook.core.admission_policies import PARAMS_NAME, POLICY_NAME
from webhook.runai.binding import BINDING_ANNOTATION, FINALIZER
from webhook.snapshot import RUNAI_PROJECT_ID_LABEL

pytestmark = pytest.mark.slow

Obj = dict[str, Any]
IMAGE = "registry.example/notebook:1.0"
# The install's settings offer two classes; the default is what a changed value changes.
SCHEDULER = {"available": {"priorityClasses": ["batch", "normal"]}, "defaults": {"priorityClass": "normal"}}
VALUES: Obj = {"variables": {"scheduler": SCHEDULER, "run_ai_reconcile_interval_s": 2}}
CONFLICT = "Kueue and Run:ai cannot both be on"


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    with own_control_plane("chart", "helm install and uninstall need a control plane of their own") as cp:
        yield cp


@pytest.fixture(scope="module")
def release(plane: ControlPlane) -> Iterator[Install]:
    with installed(plane, plane.dir / "install", VALUES) as inst:
        yield inst


@pytest.fixture
async def cluster(release: Install, tmp_path: Path) -> AsyncIterator[Cluster]:
    home = tmp_path / "home"
    home.mkdir()
    yield Cluster(release.cp.admin_kubeconfig, home, str(release.cp.kubectl_bin), release)


def pod(name: str, namespace: str) -> Obj:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": {"hopsworks.ai/workload-type": "notebook"}},
            "spec": {"containers": [{"name": "main", "image": IMAGE}]}}  # fmt: skip


def revision(cp: ControlPlane) -> int:
    history = yaml.safe_load(helm(cp, "history", chart.RELEASE, "--namespace", INSTALL_NS, "--output", "yaml"))
    return int(history[-1]["revision"])


def ca_secrets(cp: ControlPlane) -> tuple[str, str]:
    """The chart's CA (its Secret) and the serving Secret's ca.crt: what every caBundle must stay."""
    ca = cp.get_json("secret", f"{TLS_SECRET}-ca", "-n", INSTALL_NS)["data"]["tls.crt"]
    return ca, cp.get_json("secret", TLS_SECRET, "-n", INSTALL_NS)["data"]["ca.crt"]


def ca_bundles(cp: ControlPlane) -> set[str]:
    bundles = set()
    for kind in ("mutatingwebhookconfiguration", "validatingwebhookconfiguration"):
        for obj in cp.get_json(kind, "-l", "app.kubernetes.io/name=scheduling-webhook")["items"]:
            bundles |= {h["clientConfig"]["caBundle"] for h in obj["webhooks"]}
    return bundles


async def created(cluster: Cluster, name: str, namespace: str) -> Obj:
    await cluster.apply(pod(name, namespace))
    return await cluster.get("pod", name, namespace)


def server_pods(cp: ControlPlane) -> set[str]:
    items = cp.get_json("pods", "-n", INSTALL_NS, "-l", "app.kubernetes.io/name=scheduling-webhook")["items"]
    return {p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp")}


async def test_install_upgrade_and_rollback(cluster: Cluster, release: Install, pytestconfig: pytest.Config) -> None:
    cp = release.cp
    # helm install: the release is deployed, the webhooks answer, a project's pod is mutated.
    status = helm(cp, "status", chart.RELEASE, "--namespace", INSTALL_NS)
    assert "STATUS: deployed" in status and "Certificates: certs.mode helm (the chart's own CA" in status, status
    project = await cluster.project("life")
    assert (await created(cluster, "first", project))["spec"]["priorityClassName"] == "normal"
    plain = f"plain-{uuid.uuid4().hex[:6]}"
    await cluster.ok("create", "namespace", plain)
    cluster.namespaces.append(plain)
    assert "priorityClassName" not in (await created(cluster, "other", plain))["spec"]  # not a project
    ca_before, bundles_before = ca_secrets(cp), ca_bundles(cp)
    assert bundles_before == {ca_before[0]} and ca_before[0] == ca_before[1]
    pods_before, at = server_pods(cp), revision(cp)

    # helm upgrade with a changed setting and a changed pod template, pods created all along.
    batch_default = {**SCHEDULER, "defaults": {"priorityClass": "batch"}}
    changed = {
        **VALUES,
        "podAnnotations": {"rolled": "once"},
        "variables": {**VALUES["variables"], "scheduler": batch_default},
    }
    rest = Rest(cp.url, cp.pki.ca_file, cp.dir / "pki/admin.crt", cp.dir / "pki/admin.key")
    loop = Creations(rest, project).start()
    try:
        await asyncio.sleep(10)  # the same loop with nothing rolling, to compare with
        started = time.monotonic()
        out = await asyncio.to_thread(helm_install, cp, changed, "--wait", "--timeout", "5m", command="upgrade")
        upgraded_s = time.monotonic() - started
        # --wait returns once the new pods are Ready; the old ones drain (preStop) after that.
        await cluster.eventually(lambda: not (server_pods(cp) & pods_before) and len(server_pods(cp)) == 2,
                                 "the old replicas gone", within_s=120)  # fmt: skip
        await asyncio.sleep(2)
    finally:
        loop.stop()
    assert f"REVISION: {at + 1}" in out, out
    steady, rolling = loop.longest_gap_s(before=started), loop.longest_gap_s(after=started)
    _report(pytestconfig, f"\nhelm upgrade (pods rolled): {len(loop.results)} pod creations, "
            f"{len(loop.refusals())} refused; longest gap between successes {rolling * 1000:.0f} ms while rolling, "
            f"{steady * 1000:.0f} ms in the 10 s before (x{rolling / max(steady, 1e-3):.1f}); slowest creation "
            f"{loop.slowest_s() * 1000:.0f} ms; helm upgrade --wait {upgraded_s:.1f} s")  # fmt: skip
    assert loop.refusals() == [], loop.refusals()[:5]
    assert len(loop.results) > 10
    data = cp.get_json("configmap", SETTINGS, "-n", INSTALL_NS)["data"]
    assert "priorityClass: batch" in data["scheduler"]
    assert (await created(cluster, "after-upgrade", project))["spec"]["priorityClassName"] == "batch"
    assert (ca_secrets(cp), ca_bundles(cp)) == (ca_before, bundles_before)  # the upgrade kept the CA

    # helm rollback: the previous revision's settings again, the CA still the same.
    out = await asyncio.to_thread(helm, cp, "rollback", chart.RELEASE, str(at), "--namespace", INSTALL_NS, "--wait",
                                  "--timeout", "5m")  # fmt: skip
    assert "Rollback was a success" in out, out
    assert revision(cp) == at + 2
    assert "priorityClass: normal" in cp.get_json("configmap", SETTINGS, "-n", INSTALL_NS)["data"]["scheduler"]

    async def back_to_normal() -> bool:
        stored = await created(cluster, f"rolled-back-{uuid.uuid4().hex[:4]}", project)
        return stored["spec"]["priorityClassName"] == "normal"

    await cluster.eventually(back_to_normal, "pods mutated with the rolled-back settings", within_s=30)
    assert (ca_secrets(cp), ca_bundles(cp)) == (ca_before, bundles_before)
    release.wait_ready()


def serving(cp: ControlPlane) -> tuple[str, str]:
    secret = cp.get_json("secret", TLS_SECRET, "-n", INSTALL_NS)
    return secret["data"]["tls.crt"], secret["metadata"]["annotations"]["scheduling.hopsworks.ai/not-after"]


async def test_an_upgrade_near_the_certificates_end_renews_it_from_the_same_ca_without_a_gap(
    cluster: Cluster, release: Install, pytestconfig: pytest.Config
) -> None:
    cp = release.cp
    project = await cluster.project("renew")
    ca, bundles, (cert, not_after) = ca_secrets(cp), ca_bundles(cp), serving(cp)
    # An upgrade with nothing changed keeps the serving certificate as it is.
    await asyncio.to_thread(helm_install, cp, VALUES, "--wait", command="upgrade")
    assert serving(cp) == (cert, not_after)
    reloads = release.metric("webhook_certificate_reloads_total", result="success")
    reloads = reloads if len(reloads) == 2 else [0.0, 0.0]  # no sample before a first reload
    # Within renewBeforeDays of its end (here: a window longer than its life), the next upgrade renews it.
    renew = {**VALUES, "certs": {"helm": {"renewBeforeDays": 400}}}
    rest = Rest(cp.url, cp.pki.ca_file, cp.dir / "pki/admin.crt", cp.dir / "pki/admin.key")
    loop = Creations(rest, project).start()
    try:
        await asyncio.to_thread(helm_install, cp, renew, "--wait", command="upgrade")
        renewed = serving(cp)
        assert renewed[0] != cert and int(renewed[1]) >= int(not_after)

        def reloaded() -> bool:
            now = release.metric("webhook_certificate_reloads_total", result="success")
            return len(now) == 2 and all(b > a for a, b in zip(reloads, now, strict=True))

        await cluster.eventually(reloaded, "both replicas serving the renewed certificate", within_s=60)
        await asyncio.sleep(1)
    finally:
        loop.stop()
    _report(pytestconfig, f"\nhelm upgrade (certificate renewed): {len(loop.results)} pod creations, "
            f"{len(loop.refusals())} refused; longest gap {loop.longest_gap_s() * 1000:.0f} ms")  # fmt: skip
    assert loop.refusals() == [], loop.refusals()[:5]
    assert (ca_secrets(cp), ca_bundles(cp)) == (ca, bundles)  # the same CA: no caBundle changed
    # The pods were not restarted for it: the same two replicas reloaded the files.
    assert len(release.running()) == 2


async def test_the_conflict_and_a_bad_value_fail_install_and_upgrade_with_their_message(release: Install) -> None:
    cp = release.cp
    at = revision(cp)
    conflicts = [
        {"variables": {"kueue_installed": True, "run_ai_enable": True, "run_ai_client_id": "hw"}},
        {"variables": {"run_ai_enable": True, "run_ai_client_id": "hw"}, "global": {"_hopsworks": {"kueue": {
            "enabled": True}}}},
    ]  # fmt: skip
    bad = {"variables": {"run_ai_default_department": "Data_Science"}}
    schema = "at '/variables/run_ai_default_department': 'Data_Science' does not match"
    for values, message in [*((c, CONFLICT) for c in conflicts), (bad, schema)]:
        with pytest.raises(chart.HelmFailed) as upgrade:
            helm_install(cp, {**VALUES, **values}, command="upgrade")
        assert message in upgrade.value.stderr and upgrade.value.stderr.count("Error:") == 1, upgrade.value.stderr
        # A fresh install (another release, another namespace) fails alike, before it creates anything.
        with pytest.raises(chart.HelmFailed) as install:
            helm(
                cp, "install", "second", str(chart.CHART), "--namespace", "second", "--create-namespace", values=values
            )
        assert message in install.value.stderr, install.value.stderr
    assert revision(cp) == at  # nothing was upgraded
    assert "second" not in helm(cp, "list", "--all-namespaces", "--short")
    assert not [n for n in cp.get_json("namespaces")["items"] if n["metadata"]["name"] == "second"]


async def test_uninstall_leaves_project_namespaces_that_delete_and_nothing_else(
    cluster: Cluster, release: Install
) -> None:
    cp, runai = release.cp, release.runai
    # Run:ai on, as the platform's docs say: the values, then helm upgrade. A project's first pod
    # binds it: this server's finalizer, label and annotation on the namespace.
    runai_on = {**VALUES, "variables": {**VALUES["variables"], "run_ai_enable": True, "run_ai_url": release.runai_url,
                                        "run_ai_client_id": runai.client_id}}  # fmt: skip
    await asyncio.to_thread(helm_install, cp, runai_on, "--wait", command="upgrade")
    project = await cluster.project("bound")

    async def bound_pod_admitted() -> bool:
        result = await cluster.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(pod("nb", project)))
        return result.rc == 0

    await cluster.eventually(bound_pod_admitted, f"a pod of {project} admitted once it is bound", within_s=60)
    meta = (await cluster.get("namespace", project))["metadata"]
    assert FINALIZER in meta.get("finalizers", []) and RUNAI_PROJECT_ID_LABEL in meta["labels"], meta
    assert cp.get_json("lease", "scheduling-webhook-leader", "-n", INSTALL_NS)
    # Another project, bound by the leader's pass, whose project label an installer (the admin, in
    # system:masters) then took off: the finalizer stays, and no label selector finds it.
    former = await cluster.project("former")

    async def finalized() -> bool:
        return FINALIZER in (await cluster.get("namespace", former))["metadata"].get("finalizers", [])

    await cluster.eventually(finalized, f"{former} bound by the leader", within_s=60)
    await cluster.ok("label", "namespace", former, "hopsworks.ai/project-")
    compiled = _compiled_policies_served(cp)
    if compiled:  # 1.36 and newer: the chart installed the compiled policies, the leader wrote the parameters

        async def params_written() -> bool:
            result = await cluster.kubectl("get", "configmap", PARAMS_NAME, "-n", project)
            return result.rc == 0

        await cluster.eventually(params_written, f"the parameters of {project} written", within_s=60)
        assert cp.get_json("mutatingadmissionpolicybinding", POLICY_NAME)

    out = await asyncio.to_thread(helm, cp, "uninstall", chart.RELEASE, "--namespace", INSTALL_NS, "--wait",
                                  "--timeout", "5m")  # fmt: skip
    assert "uninstalled" in out, out
    meta = (await cluster.get("namespace", project))["metadata"]
    assert FINALIZER not in meta.get("finalizers", []), meta
    assert RUNAI_PROJECT_ID_LABEL not in meta["labels"] and BINDING_ANNOTATION not in meta.get("annotations", {})
    assert meta["labels"]["runai/queue"] == project  # left on purpose: Run:ai still schedules it
    # Deleting the project namespace now completes: nothing waits for a finalizer of ours.
    await cluster.ok("delete", "namespace", project, "--wait=false")

    async def gone() -> bool:
        result = await cluster.kubectl("get", "namespace", project)
        return result.rc != 0 and "NotFound" in result.stderr

    await cluster.eventually(gone, f"{project} deleted", within_s=90)
    meta = (await cluster.get("namespace", former))["metadata"]
    assert FINALIZER not in meta.get("finalizers", []) and RUNAI_PROJECT_ID_LABEL not in meta["labels"], meta
    await cluster.ok("delete", "namespace", former, "--wait=false")

    async def former_gone() -> bool:
        result = await cluster.kubectl("get", "namespace", former)
        return result.rc != 0 and "NotFound" in result.stderr

    await cluster.eventually(former_gone, f"{former} deleted", within_s=90)

    nothing_of_the_chart_left(cp)
    configmaps = {o["metadata"]["name"] for o in cp.get_json("configmaps", "-n", INSTALL_NS)["items"]}
    assert configmaps <= {"kube-root-ca.crt", "runai-projects-left"}, configmaps  # the record, left on purpose
    if compiled:  # helm deleted the policies with the release, the uninstall Job the leader's parameters
        kinds = ",".join(
            f"{kind}{suffix}"
            for kind in ("mutatingadmissionpolic", "validatingadmissionpolic")
            for suffix in ("ies", "ybindings")
        )
        left = [o["metadata"]["name"] for o in cp.get_json(kinds)["items"]]
        assert POLICY_NAME not in left, left
        params = cp.get_json("configmaps", "--all-namespaces", "--field-selector", f"metadata.name={PARAMS_NAME}")
        assert params["items"] == [], params["items"]
    secrets = {o["metadata"]["name"] for o in cp.get_json("secrets", "-n", INSTALL_NS)["items"]}
    assert secrets == {"runai-hopsworks"}, secrets  # the Run:ai client's: the operator's own
    # What stays in Run:ai: the project of the namespace (nothing of ours runs to delete it).
    assert [p for p in runai.projects.values() if p["name"] == project], runai.projects


async def test_the_uninstall_jobs_identity_may_only_take_this_systems_keys_off_namespaces(
    cluster: Cluster, release: Install
) -> None:
    # The hook's ServiceAccount may patch every namespace (RBAC cannot select them), and the
    # chart's policies are gone when it runs. Its own policy, applied here as the hook does (without
    # the Job), is evaluated by the real apiserver for that identity.
    cp = release.cp
    guard = [o for o in chart.render(VALUES, INSTALL_NS)
             if "helm.sh/hook" in (o["metadata"].get("annotations") or {}) and o["kind"] != "Job"]  # fmt: skip
    (policy,) = [o["metadata"]["name"] for o in guard if o["kind"] == "ValidatingAdmissionPolicy"]
    account = next(o["metadata"]["name"] for o in guard if o["kind"] == "ServiceAccount")
    as_job = f"--as=system:serviceaccount:{INSTALL_NS}:{account}"
    name = f"tools-{uuid.uuid4().hex[:6]}"
    await cluster.ok("create", "namespace", name)
    ours = {"metadata": {"labels": {RUNAI_PROJECT_ID_LABEL: "7", "team": "tools"},
                         "annotations": {BINDING_ANNOTATION: "{}"},
                         "finalizers": [FINALIZER, "example.com/keep"]}}  # fmt: skip
    await cluster.ok("patch", "namespace", name, "--type=merge", "-p", json.dumps(ours))
    cp.apply(guard)
    try:

        async def refused_by_the_policy(*args: str) -> str | None:
            result = await cluster.kubectl(as_job, *args)
            return result.stderr if result.rc != 0 and f"'{policy}'" in result.stderr else None

        # A new policy takes a moment to be enforced; the Job waits for it the same way, with a dry
        # run (an edit let through before then would stay made).
        await cluster.eventually(
            lambda: refused_by_the_policy("label", "namespace", name, "probe=1", "--dry-run=server"),
            "the uninstall policy enforced",
            within_s=30,
        )
        for args in (
            ("label", "namespace", name, "pod-security.kubernetes.io/enforce=privileged"),
            ("label", "namespace", name, "team-"),
            ("annotate", "namespace", name, "owner=someone"),
            ("patch", "namespace", name, "--type=merge", "-p", json.dumps({"metadata": {"finalizers": [FINALIZER]}})),
        ):
            assert await refused_by_the_policy(*args), args
        # Its ConfigMap deletes (granted namespace-wide) reach only the server's own.
        await cluster.ok("create", "configmap", "platform-notes", "-n", INSTALL_NS, "--from-literal=a=b")
        assert await refused_by_the_policy("delete", "configmap", "platform-notes", "-n", INSTALL_NS)
        reservation = {"apiVersion": "v1", "kind": "ConfigMap",
                       "metadata": {"name": f"gpu-reservations.{name}", "namespace": INSTALL_NS,
                                    "labels": {"scheduling.hopsworks.ai/gpu-reservations": "true"}}}  # fmt: skip
        await cluster.apply(reservation)
        await cluster.ok(as_job, "delete", "configmap", f"gpu-reservations.{name}", "-n", INSTALL_NS)
        # What it is there for passes: this system's finalizer, label and annotation taken off.
        drop = {"metadata": {"finalizers": ["example.com/keep"], "labels": {RUNAI_PROJECT_ID_LABEL: None},
                             "annotations": {BINDING_ANNOTATION: None}}}  # fmt: skip
        await cluster.ok(as_job, "patch", "namespace", name, "--type=merge", "-p", json.dumps(drop))
        meta = (await cluster.get("namespace", name))["metadata"]
        assert meta["finalizers"] == ["example.com/keep"] and RUNAI_PROJECT_ID_LABEL not in meta["labels"], meta
    finally:
        for obj in guard:
            where = ["-n", obj["metadata"]["namespace"]] if obj["metadata"].get("namespace") else []
            await cluster.kubectl("delete", obj["kind"].lower(), obj["metadata"]["name"], *where, "--ignore-not-found")
        await cluster.kubectl("delete", "configmap", "platform-notes", "-n", INSTALL_NS, "--ignore-not-found")
        await cluster.kubectl("patch", "namespace", name, "--type=merge", "-p", '{"metadata":{"finalizers":[]}}')
        await cluster.kubectl("delete", "namespace", name, "--wait=false")


def _compiled_policies_served(cp: ControlPlane) -> bool:
    found = cp.kubectl("get", "--raw", "/apis/admissionregistration.k8s.io/v1", check=False)
    return found.returncode == 0 and '"MutatingAdmissionPolicy"' in found.stdout


def nothing_of_the_chart_left(cp: ControlPlane) -> None:
    """No object with the chart's label in any kind it renders, no release, no Lease, pod or Job."""
    assert chart.RELEASE not in helm(cp, "list", "--all-namespaces", "--short")
    kinds = "all,configmaps,secrets,serviceaccounts,roles,rolebindings,leases,poddisruptionbudgets,jobs"
    cluster_kinds = ("clusterroles,clusterrolebindings,mutatingwebhookconfigurations,validatingwebhookconfigurations,"
                     "validatingadmissionpolicies,validatingadmissionpolicybindings,apiservices")  # fmt: skip
    # kube-system: the RoleBinding that reads the aggregation layer's front-proxy CA.
    for namespace in (INSTALL_NS, RUNAI_NAMESPACE, "kube-system"):
        left = cp.get_json(kinds, "-n", namespace, "-l", "app.kubernetes.io/name")["items"]
        assert left == [], [(o["kind"], o["metadata"]["name"]) for o in left]
    left = cp.get_json(cluster_kinds, "-l", "app.kubernetes.io/name")["items"]
    assert left == [], [(o["kind"], o["metadata"]["name"]) for o in left]
    assert not cp.get_json("leases", "-n", INSTALL_NS)["items"]
    assert not cp.get_json("pods,jobs", "-n", INSTALL_NS)["items"]


def readme_block(heading: str) -> list[str]:
    """The commands of the first bash block under `heading` in manifests/README.md, comments dropped."""
    text = (chart.PLAIN_DIR / "README.md").read_text()
    section = text[text.index(heading) + len(heading) :]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block, heading
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def example_image() -> str:
    """The image the README's values (examples/values.example.yaml) name."""
    image = yaml.safe_load((peers.REPO / "examples/values.example.yaml").read_text())["image"]
    return f"{image['repository']}:{image['tag']}"


def run_as_an_operator(commands: list[str], cwd: Path, cp: ControlPlane, home: Path) -> None:
    """Each command as written, with the real kubectl and helm on PATH and the cluster's kubeconfig."""
    bin = home / "bin"
    bin.mkdir(parents=True, exist_ok=True)
    for name, target in (("kubectl", cp.kubectl_bin), ("helm", peers.binary("helm"))):
        if not (bin / name).exists():
            (bin / name).symlink_to(target)
    env = {"PATH": f"{bin}:/usr/bin:/bin", "HOME": str(home), "KUBECONFIG": str(cp.admin_kubeconfig)}
    for command in commands:
        done = subprocess.run(shlex.split(command), cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, (command, done.stdout, done.stderr)


async def test_the_readme_from_helm_install_to_helm_uninstall(release: Install, tmp_path: Path) -> None:
    """manifests/README.md's Install and Uninstall blocks, run as written on this control plane
    (after the release above is gone): nothing else is needed for working webhooks and a clean exit."""
    cp = release.cp
    nothing_of_the_chart_left(cp)
    # The README's values name neither the test image nor the real nodes: the nodes get the image
    # under the name the example values give it (as the operator's registry would serve it), lose
    # their taint, and the kwok nodes (which run no container) are cordoned, for this test alone.
    assert cp.real is not None
    _archive, tag = image_archive()
    for node in cp.real.nodes:
        cp.real.ctr(node, "images", "tag", "--force", tag, example_image())
    taint = f"{REAL_NODE_TAINT['key']}={REAL_NODE_TAINT['value']}:{REAL_NODE_TAINT['effect']}"
    kwok_nodes = [n.name for n in cp.nodes]
    for node in cp.real.nodes:
        cp.kubectl("taint", "node", node, f"{taint}-")
    for node in kwok_nodes:
        cp.kubectl("cordon", node)
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("examples", "manifests"):
        (checkout / name).symlink_to(peers.REPO / name)
    home = tmp_path / "home"
    cluster = Cluster(cp.admin_kubeconfig, home, str(cp.kubectl_bin), None)
    try:
        install = readme_block("## Install\n")
        assert any(c.startswith("helm install ") and "--wait" in c for c in install), install
        await asyncio.to_thread(run_as_an_operator, install, checkout, cp, home)
        # The webhooks answer: a project's pod gets the example settings' default class.
        project = await cluster.project("readme")
        assert (await created(cluster, "nb", project))["spec"]["priorityClassName"] == "hopsworks-normal"
        uninstall = readme_block("## Uninstall\n")
        assert uninstall == ["helm uninstall scheduling-webhook --namespace hopsworks --wait"]
        await asyncio.to_thread(run_as_an_operator, uninstall, checkout, cp, home)
        nothing_of_the_chart_left(cp)
        await cluster.ok("delete", "namespace", project, "--wait=true", "--timeout=90s")
    finally:
        for node in kwok_nodes:
            cp.kubectl("uncordon", node, check=False)
        for node in cp.real.nodes:
            cp.kubectl("taint", "node", node, taint, "--overwrite", check=False)
