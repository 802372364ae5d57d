"""The two ValidatingAdmissionPolicies we ship (manifests/07-validatingadmissionpolicy.yaml), as the
real apiserver evaluates their CEL.

RBAC grants the server ConfigMap writes namespace-wide and namespace patches cluster-wide; the
policies narrow both to what the server owns. A whole project life made by the replicas (their
own ServiceAccount) meets no denial at all, which the apiserver's audit log shows request by
request; the same ServiceAccount writing anything else is denied with the policy's message.
"""

from __future__ import annotations

import json
import re
import ssl
import time
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.e2e.conftest import Cluster, Obj
from tests.e2e.runai_steps import (
    DEPARTMENT_LABEL,
    FINALIZER,
    admin_token,
    create_pod,
    delete_pods,
    ensure_department,
    gpu_notebook,
    in_standin,
    move,
    namespace_meta,
    wait_bound,
)
from tests.e2e.test_kubectl import turn_runai_on
from tests.support.control_plane.audit import summary
from tests.support.control_plane.install import INSTALL_NS, LEASE, SERVICE_ACCOUNT_USER, SETTINGS, Install, secret
from webhook.console.keys import format_keys, new_key
from webhook.console.signouts import SIGNOUTS_CONFIGMAP as SIGNOUTS

pytestmark = pytest.mark.slow
OWN_OBJECTS = "hopsworks-scheduling-webhook-own-objects"
NAMESPACES = "hopsworks-scheduling-webhook-namespaces"
CONSOLE_KEYS = "scheduling-webhook-console"
CONFIGMAPS_MESSAGE = (
    "scheduling-webhook writes only its GPU reservation ConfigMaps (gpu-reservations.*, labelled), "
    "runai-projects-left and scheduling-webhook-console-signouts, not "
)


def _report(config: pytest.Config, line: str) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)


async def test_a_whole_project_life_made_by_the_server_meets_no_policy_denial(
    cluster: Cluster, pytestconfig: pytest.Config
) -> None:
    local = cluster.needs_local("reads the apiserver's audit log")
    audit = local.cp.audit
    since = audit.mark()
    await turn_runai_on(cluster)
    await ensure_department(cluster, local, "nlp-dept")
    token = await admin_token(cluster)

    # Bind: the leader labels the new project, records its intent and puts our finalizer on it.
    project = await cluster.project("life")
    await wait_bound(cluster, project)
    created = in_standin(local, lambda: local.runai.project(project))
    assert created is not None

    # Reserve GPUs: two notebooks of one GPU each fill the quota of 2 (a reservation ConfigMap is
    # created, then updated); a third is refused by our webhook, not by a policy.
    for name in ("nb-1", "nb-2"):
        result = await create_pod(cluster, gpu_notebook(name, project))
        assert result.rc == 0, str(result)
    refused = await create_pod(cluster, gpu_notebook("nb-3", project))
    assert refused.rc != 0 and "0 of 2 deserved GPUs left" in refused.stderr, str(refused)

    # Move a department: the pods go first (a busy project is not moved), then the admin API.
    await delete_pods(cluster, project)
    moved = await move(local, token, project, "nlp-dept")
    assert moved["outcome"] == "moved", moved
    assert (await namespace_meta(cluster, project))["labels"][DEPARTMENT_LABEL] == "nlp-dept"

    # The console: signed in and out (the sign-out is merged into the sign-outs ConfigMap).
    await cluster.apply(console_keys())
    try:
        assert await console_sign_in_and_out(cluster, local, token) == 303
    finally:
        await cluster.ok("delete", "secret", CONSOLE_KEYS, "-n", INSTALL_NS)

    # Lead: the leader lets go of the Lease and takes it again (created anew, then renewed).
    local.release_leadership()
    await cluster.eventually(lambda: _lease_holder(cluster), "the Lease taken again", 30)

    # Delete: the Run:ai project goes, then our finalizer, then the namespace.
    await cluster.ok("delete", "namespace", project, "--wait=false")
    await cluster.eventually(lambda: _namespace_gone(cluster, project), f"{project} deleted", 60)
    assert in_standin(local, lambda: local.runai.project(project)) is None

    events = audit.events(since, user=SERVICE_ACCOUNT_USER)
    figures = summary(events)
    _report(pytestconfig, f"\nthe server's requests in one project life (audit log): {json.dumps(figures)}")
    assert [str(e) for e in events if e.code in (401, 403) or e.policy_denied or e.rbac_denied] == []
    writes = {(e.verb, e.resource) for e in events if e.is_write and e.code < 400}
    # Every write the policies narrow was made, and passed them.
    for needed in [("patch", "namespaces"), ("create", "configmaps"), ("update", "configmaps"),
                   ("create", "leases.coordination.k8s.io"), ("update", "leases.coordination.k8s.io")]:  # fmt: skip
        assert needed in writes, f"the life made no {needed}: {sorted(writes)}"
    patched = {e.name for e in events if e.verb == "patch" and e.resource == "namespaces" and e.code < 400}
    assert project in patched
    configmaps = {e.name for e in events if e.is_write and e.resource == "configmaps" and e.code < 400}
    assert {f"gpu-reservations.{project}", SIGNOUTS} <= configmaps, configmaps


def console_keys() -> Obj:
    """The console's session key Secret, as `scheduling-webhook console-keys` writes its file."""
    text = format_keys([new_key(time.time() - 60)])
    return secret(CONSOLE_KEYS, INSTALL_NS, {"session-keys": text.encode()})


async def console_sign_in_and_out(cluster: Cluster, local: Install, token: str) -> int:
    """Sign in with a token, open the console, sign out; each replica mounts the keys (re-read every
    5 s), so either may answer each step."""
    base = f"https://{local.service_ip}"
    ctx = ssl.create_default_context(cafile=str(local.dir / "ca.crt"))
    ctx.check_hostname = False  # the certificate names the Service, not its address
    origin = {"Origin": base}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as session:

        async def signed_in() -> bool:
            async with session.post(f"{base}/ui/signin", data={"token": token}, headers=origin, ssl=ctx,
                                    allow_redirects=False) as resp:  # fmt: skip
                return resp.status == 303

        await cluster.eventually(signed_in, "sign-in with the session keys mounted", 30)
        async with session.get(f"{base}/ui/", ssl=ctx) as resp:
            found = re.search(r'name="csrf" value="([^"]+)"', await resp.text())
        assert found is not None
        async with session.post(f"{base}/ui/signout", data={"csrf": found.group(1)}, headers=origin, ssl=ctx,
                                allow_redirects=False) as resp:  # fmt: skip
            return resp.status


async def _lease_holder(cluster: Cluster) -> str | None:
    result = await cluster.kubectl("get", "lease", LEASE, "-n", INSTALL_NS, "-o", "json")
    return json.loads(result.stdout)["spec"].get("holderIdentity") if result.rc == 0 else None


async def _namespace_gone(cluster: Cluster, name: str) -> bool:
    result = await cluster.kubectl("get", "namespace", name)
    return result.rc != 0 and "NotFound" in result.stderr


def _denied_by(policy: str, stderr: str, message: str) -> None:
    assert f"ValidatingAdmissionPolicy '{policy}' with binding '{policy}' denied request: " in stderr, stderr
    assert message in stderr, stderr


async def test_the_servers_writes_outside_the_policies_lists_are_denied_with_their_messages(
    cluster: Cluster, tmp_path: Path
) -> None:
    local = cluster.needs_local("acts as the server's ServiceAccount with a token of its own")
    audit = local.cp.audit
    since = audit.mark()
    as_server = ["--kubeconfig", str(local.service_account_kubeconfig())]

    # The settings ConfigMap: an update RBAC allows (ConfigMap writes are namespace-wide).
    settings = await cluster.get("configmap", SETTINGS, INSTALL_NS)
    settings["data"] = {**settings.get("data", {}), "run_ai_enable": "true"}
    stderr = await cluster.refused(*as_server, "replace", "-f", "-", stdin=yaml.safe_dump(settings))
    _denied_by(OWN_OBJECTS, stderr, CONFIGMAPS_MESSAGE + SETTINGS)
    assert (await cluster.get("configmap", SETTINGS, INSTALL_NS))["data"]["run_ai_enable"] == "false"
    # Another ConfigMap of the platform's namespace, and one named like a reservation but unlabelled.
    stderr = await cluster.refused(*as_server, "create", "configmap", "platform-notes", "-n", INSTALL_NS,
                                   "--from-literal=a=b")  # fmt: skip
    _denied_by(OWN_OBJECTS, stderr, CONFIGMAPS_MESSAGE + "platform-notes")
    stderr = await cluster.refused(*as_server, "create", "configmap", "gpu-reservations.fake", "-n", INSTALL_NS)
    _denied_by(OWN_OBJECTS, stderr, CONFIGMAPS_MESSAGE + "gpu-reservations.fake")
    # Another Lease.
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "another-leader", "namespace": INSTALL_NS},
             "spec": {"holderIdentity": "x"}}  # fmt: skip
    stderr = await cluster.refused(*as_server, "create", "-f", "-", stdin=yaml.safe_dump(lease))
    _denied_by(OWN_OBJECTS, stderr, "scheduling-webhook writes only its own Lease, not another-leader")
    # The policy is about this ServiceAccount only: the admin writes the same ConfigMap.
    await cluster.ok("create", "configmap", "platform-notes", "-n", INSTALL_NS, "--from-literal=a=b")
    await cluster.ok("delete", "configmap", "platform-notes", "-n", INSTALL_NS)

    # A namespace that is not a project: RBAC allows patching every namespace.
    other = await cluster.plain_namespace("tools")
    stderr = await cluster.refused(*as_server, "label", "namespace", other, f"runai/queue={other}")
    _denied_by(NAMESPACES, stderr, "scheduling-webhook edits project namespaces (label hopsworks.ai/project) only")
    # A project namespace, but a label, an annotation or a finalizer the server does not own.
    project = await cluster.project("owned")
    stderr = await cluster.refused(*as_server, "label", "namespace", project,
                                   "pod-security.kubernetes.io/enforce=privileged")  # fmt: skip
    _denied_by(NAMESPACES, stderr, "scheduling-webhook changes only the labels runai/queue, "
               "hopsworks.ai/runai-project-id, hopsworks.ai/department and "
               "scheduling.hopsworks.ai/admission-policies")  # fmt: skip
    stderr = await cluster.refused(*as_server, "label", "namespace", project, "hopsworks.ai/project-")
    _denied_by(NAMESPACES, stderr, "scheduling-webhook changes only the labels")
    stderr = await cluster.refused(*as_server, "annotate", "namespace", project, "owner=someone")
    _denied_by(NAMESPACES, stderr, "scheduling-webhook changes only the annotations "
               "scheduling.hopsworks.ai/runai-binding and scheduling.hopsworks.ai/runai-move")  # fmt: skip
    finalizers = json.dumps({"metadata": {"finalizers": ["example.com/keep"]}})
    stderr = await cluster.refused(*as_server, "patch", "namespace", project, "--type=merge", "-p", finalizers)
    _denied_by(NAMESPACES, stderr, f"scheduling-webhook adds and removes only its finalizer {FINALIZER}")
    # What it owns it may write (the leader does the same when Run:ai is on).
    await cluster.ok(*as_server, "label", "namespace", project, f"{DEPARTMENT_LABEL}=vision")

    # A namespace that is no longer a project but still carries the server's finalizer (an
    # installer took the label off): not yet being deleted, the finalizer may not be touched.
    former = await cluster.plain_namespace("former")
    held = json.dumps({"metadata": {"finalizers": [FINALIZER, "example.com/keep"]}})
    await cluster.ok("patch", "namespace", former, "--type=merge", "-p", held)
    release = json.dumps({"metadata": {"finalizers": ["example.com/keep"]}})
    stderr = await cluster.refused(*as_server, "patch", "namespace", former, "--type=merge", "-p", release)
    _denied_by(NAMESPACES, stderr, "scheduling-webhook edits project namespaces (label hopsworks.ai/project) only")
    # Being deleted, the server takes its finalizer off (the leader does, unasked) and nothing else.
    await cluster.ok("delete", "namespace", former, "--wait=false")
    try:

        async def released() -> bool:
            return (await namespace_meta(cluster, former)).get("finalizers") == ["example.com/keep"]

        await cluster.eventually(released, f"the leader took its finalizer off {former}", 30)
        stderr = await cluster.refused(*as_server, "label", "namespace", former, f"runai/queue={former}")
        _denied_by(NAMESPACES, stderr, "other namespaces only to remove its finalizer")
    finally:
        await cluster.kubectl("patch", "namespace", former, "--type=merge", "-p", '{"metadata":{"finalizers":[]}}')

    # The apiserver recorded each refusal as the policy's, none as RBAC's.
    events = audit.events(since, user=SERVICE_ACCOUNT_USER)
    denied = [e for e in events if e.policy_denied]
    assert len(denied) == 11, [str(e) for e in events if e.code >= 400]
    assert not [e for e in events if e.rbac_denied], [str(e) for e in events if e.rbac_denied]
