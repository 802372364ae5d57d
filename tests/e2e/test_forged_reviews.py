"""Who can speak for the apiserver, on the real control plane with the chart installed.

The apiserver here presents a client certificate to webhooks (its AdmissionConfiguration, as an
operator who configures the apiserver writes it), and the install requires it on the admission
port (`admission.clientCA`, `admission.clientNames`): a process without it that posts a review to
the Service's address is refused and nothing is stored. With the client CA off, as on a managed
cluster whose apiserver cannot be given a certificate, a forged review does what the design bounds
it to (docs/ARCHITECTURE.md, "Threat model"); what it does is measured and reported.
"""

from __future__ import annotations

import asyncio
import copy
import json
import ssl
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.e2e.conftest import Cluster, Obj, _report
from tests.e2e.runai_steps import create_pod, delete_pods, gpu_notebook, in_standin, wait_bound
from tests.e2e.test_kubectl import turn_runai_on
from tests.support.control_plane.install import ADMISSION_PORT, INSTALL_NS, Install, helm_install
from webhook.tls.issuing import make_client_cert

pytestmark = pytest.mark.slow

REFUSED_AT_TLS = (aiohttp.ClientError, ssl.SSLError, ConnectionError)


def review(pod: Obj, uid: str, *, dry_run: bool = False) -> Obj:
    """An AdmissionReview of creating `pod` as the apiserver would send it, the pod's uid included."""
    obj = copy.deepcopy(pod)
    obj["metadata"]["uid"] = uid
    meta = obj["metadata"]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "operation": "CREATE",
        "namespace": meta["namespace"], "name": meta["name"], "object": obj, "dryRun": dry_run,
        "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters"]},
    }}  # fmt: skip


async def post(local: Install, port: int, path: str, body: Obj, ctx: ssl.SSLContext) -> tuple[int, Any]:
    """One POST on a connection of its own (the kernel spreads new connections over the replicas)."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"https://{local.service_ip}:{port}{path}", ssl=ctx, json=body) as r,
    ):
        return r.status, json.loads(await r.text() or "null")


def another_webhook_client(local: Install, dir: Path) -> ssl.SSLContext:
    """A certificate from the apiserver's webhook client CA that names someone else: the CA is
    right, the name is not one of admission.clientNames."""
    client = local.cp.webhook_client
    assert client is not None
    other = make_client_cert(client.ca, common_name="someone-else", days=1)
    cert_file, key_file = dir / "someone-else.crt", dir / "someone-else.key"
    cert_file.write_bytes(other.cert_pem)
    key_file.write_bytes(other.key_pem)
    ctx = local.admission_ssl(as_apiserver=False)
    ctx.load_cert_chain(cert_file, key_file)
    return ctx


def cluster_ca_client(local: Install) -> ssl.SSLContext:
    """The control plane's admin certificate (system:masters), from the cluster CA: not the
    apiserver's webhook client certificate."""
    ctx = local.admission_ssl(as_apiserver=False)
    ctx.load_cert_chain(local.cp.dir / "pki/admin.crt", local.cp.dir / "pki/admin.key")
    return ctx


async def admitted_notebook(cluster: Cluster, project: str, gpus: int) -> Obj:
    """A GPU notebook as our mutating webhook labelled it (created for real, then deleted), renamed."""
    created = await create_pod(cluster, gpu_notebook("template", project))
    assert created.rc == 0, str(created)
    stored = await cluster.get("pod", "template", project)
    await delete_pods(cluster, project)
    meta = stored["metadata"]
    pod: Obj = {"apiVersion": "v1", "kind": "Pod", "spec": stored["spec"],
                "metadata": {k: meta[k] for k in ("namespace", "labels", "annotations") if k in meta}}  # fmt: skip
    pod["metadata"]["name"] = "forged-1"
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return pod


async def upgraded(cluster: Cluster, local: Install, values: Obj) -> None:
    """`helm upgrade --wait` with `values`, until only the rolled replicas listen: a replica being
    replaced still serves the Service's address while it drains."""
    await asyncio.to_thread(helm_install, local.cp, values, "--wait", "--timeout", "5m", command="upgrade")
    await asyncio.to_thread(local.ensure_running)

    def only_new() -> bool:
        return len(local.pods()) == 2 and len(local.serving()) == 2

    await cluster.eventually(only_new, "the replaced replicas gone", 90)


async def reservations(cluster: Cluster, project: str) -> dict[str, Obj]:
    result = await cluster.kubectl("get", "configmap", f"gpu-reservations.{project}", "-n", INSTALL_NS, "-o", "json")
    if result.rc != 0:
        return {}
    return {k: json.loads(v) for k, v in (json.loads(result.stdout).get("data") or {}).items()}


async def test_a_process_without_the_apiservers_certificate_is_refused_and_stores_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    local = cluster.needs_local("posts to the install's Service address")
    assert local.values["admission"]["clientCA"], "the install requires the apiserver's client certificate"
    await turn_runai_on(cluster)
    project = await cluster.project("forged")
    await wait_bound(cluster, project)
    forged = review(await admitted_notebook(cluster, project, gpus=2), "forged-uid-1")
    # The review itself would be admitted: the apiserver's certificate gets it answered (a dry run,
    # which stores nothing).
    dry = review(forged["request"]["object"], "dry-uid", dry_run=True)
    status, answer = await post(local, ADMISSION_PORT, "/validate/pods", dry, local.admission_ssl())
    assert status == 200 and answer["response"]["allowed"], answer

    another = another_webhook_client(local, tmp_path)

    def named_wrong() -> float:
        return sum(local.metric("webhook_connections_closed_total", listener="admission", reason="client_refused"))

    before = named_wrong()
    for attempt in range(8):  # fresh connections: both replicas are asked
        # No client certificate, or one of the cluster CA (even system:masters'): the handshake
        # fails; one of the right CA naming someone else: closed right after it.
        for ctx in (local.admission_ssl(as_apiserver=False), cluster_ca_client(local), another):
            with pytest.raises(REFUSED_AT_TLS):
                await post(local, ADMISSION_PORT, "/validate/pods", forged, ctx)
        with pytest.raises(REFUSED_AT_TLS):
            await post(local, ADMISSION_PORT, "/mutate/pods", forged, local.admission_ssl(as_apiserver=False))
        # The console's port, which asks for no certificate, serves no admission path.
        status, answer = await post(local, 443, "/validate/pods", forged, local.admission_ssl(as_apiserver=False))
        assert status == 404, (attempt, answer)

    assert named_wrong() >= before + 8  # each closed after its handshake, by either replica
    assert "forged-uid-1" not in await reservations(cluster, project)
    # The project's real pod gets its two GPUs.
    real = await create_pod(cluster, gpu_notebook("real", project, gpus=2))
    assert real.rc == 0, str(real)


async def test_without_client_certificates_a_forged_review_holds_gpus_for_the_confirm_window_only(
    cluster: Cluster, pytestconfig: pytest.Config
) -> None:
    """A managed cluster's case: nothing stops a pod that reaches the admission port from posting a
    review. What the forged review can do is bounded: the GPUs the project has left, for
    gpu_reservation_confirm_s (10 s), not renewable by sending it again; it binds nothing the
    leader would not bind."""
    local = cluster.needs_local("upgrades the install without the client CA")
    without = {**local.values, "admission": {"clientCA": "", "clientNames": []}}
    await upgraded(cluster, local, without)
    try:
        await turn_runai_on(cluster)  # after the upgrade, which wrote the install's settings back
        project = await cluster.project("managed")
        await wait_bound(cluster, project)
        template = await admitted_notebook(cluster, project, gpus=2)
        plain = await cluster.plain_namespace("not-a-project")
        anyone = local.admission_ssl(as_apiserver=False)
        forged = review(template, "forged-uid-1")

        # More than the project's quota: refused like any pod, nothing held.
        too_many = copy.deepcopy(forged)
        too_many["request"]["object"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "3"}}
        too_many["request"]["object"]["metadata"]["uid"] = "forged-uid-0"
        status, answer = await post(local, ADMISSION_PORT, "/validate/pods", too_many, anyone)
        assert status == 200 and not answer["response"]["allowed"], answer

        status, answer = await post(local, ADMISSION_PORT, "/validate/pods", forged, anyone)
        started = time.monotonic()
        assert status == 200 and answer["response"]["allowed"], answer
        entry = (await reservations(cluster, project))["forged-uid-1"]
        assert entry["gpus"] == 2 and entry["expires_at"] < entry["kept_until"], entry
        assert "forged-uid-0" not in await reservations(cluster, project)

        # Sent again and again: the entry stays as first written, its count is not renewed.
        refused_while_held = 0
        admitted_after_s: float | None = None
        while admitted_after_s is None:
            status, answer = await post(local, ADMISSION_PORT, "/validate/pods", forged, anyone)
            assert status == 200, answer
            assert (await reservations(cluster, project))["forged-uid-1"] == entry
            probe = await cluster.kubectl(
                "create", "--dry-run=server", "-f", "-", stdin=json.dumps(gpu_notebook("real", project, gpus=2))
            )
            if probe.rc == 0:
                admitted_after_s = time.monotonic() - started
            else:
                assert f"project {project} has 0 of 2 deserved GPUs left" in probe.stderr, str(probe)
                refused_while_held += 1
                assert time.monotonic() - started < 60, "the forged reservation still counts after 60 s"
            await asyncio.sleep(0.5)
        held_for = entry["expires_at"] - (entry["kept_until"] - 120)

        # A forged /mutate/pods binds nothing: a namespace that is no project stays unbound.
        mutate = review({**template, "metadata": {**template["metadata"], "namespace": plain}}, "forged-uid-2")
        status, answer = await post(local, ADMISSION_PORT, "/mutate/pods", mutate, anyone)
        assert status == 200 and answer["response"]["allowed"], answer
        assert in_standin(local, lambda: local.runai.project(plain)) is None
        labels = (await cluster.get("namespace", plain))["metadata"].get("labels") or {}
        assert "runai/queue" not in labels
    finally:
        await upgraded(cluster, local, local.values)
    _report(
        pytestconfig,
        f"\nforged review without client certificates: held 2 of 2 GPUs, entry counting {held_for:.0f} s; "
        f"a real 2-GPU notebook refused {refused_while_held} times, admitted {admitted_after_s:.1f} s after the "
        f"forged review, which was sent again before each of those {refused_while_held + 1} tries",
    )
