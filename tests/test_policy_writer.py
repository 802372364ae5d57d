"""The leader keeps the compiled admission policies' parameters written (`webhook.policies.writer`),
on the real apiserver with the chart's RBAC (`kube_scope`). The policies and bindings are the
chart's: here the admin applies them, as `helm install` would. Pods created through the policies
alone (no webhook is registered here) follow the settings and the project annotations as they change while pods are
being created, a new project's pods are admitted once its parameters are written, and a namespace
that stops being a project loses them. How soon each change showed in the stored pods is reported,
not asserted (timings belong in benchmarks)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from tests.support.cluster import SCHEDULER
from tests.support.kube_scope import KubeScope, eventually, object_path
from tests.support.runtime import start_runtime
from webhook.core.admission_policies import GROUP, PARAMS_NAME, POLICY_NAME, policy_objects
from webhook.kube.api import KubeApi
from webhook.snapshot import ADMISSION_POLICIES_LABEL

pytestmark = pytest.mark.slow

DEFAULTS_ANNOTATION = "scheduling.hopsworks.ai/defaults"
AVAILABLE_ANNOTATION = "scheduling.hopsworks.ai/available"
POLICY_KINDS = ("MutatingAdmissionPolicy", "ValidatingAdmissionPolicy")


def _pod(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], "automountServiceAccountToken": False},
    }


async def _served(scope: KubeScope) -> bool:
    try:
        found = await scope.call("GET", f"/apis/{GROUP}/v1")
    except ApiException:
        return False
    return any(r["kind"] == "MutatingAdmissionPolicy" for r in found["resources"])


async def _delete_policies(scope: KubeScope) -> None:
    for kind in POLICY_KINDS:
        for name in (f"{kind}Binding", kind):
            try:
                await scope.delete(f"{GROUP}/v1", name, POLICY_NAME)
            except ApiException as exc:
                if exc.status != 404:
                    raise


async def _install_policies(scope: KubeScope) -> None:
    """What the chart installs (templates/14-admission-policies.yaml), applied by the admin."""
    for obj in policy_objects("v1"):
        await scope.call("POST", object_path(obj, named=False), obj)


@pytest.fixture
async def policies_absent(kube_scope: KubeScope) -> AsyncIterator[KubeScope]:
    """The policies' names are the cluster's: none before the test, none after it, before any other
    test's pods."""
    if not await _served(kube_scope):
        pytest.skip("the apiserver serves no admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (before 1.36)")
    await _delete_policies(kube_scope)
    try:
        yield kube_scope
    finally:
        await _delete_policies(kube_scope)


@pytest.fixture
async def policies_cleared(policies_absent: KubeScope) -> AsyncIterator[KubeScope]:
    """The chart's policies and bindings, applied by the admin for the test."""
    await _install_policies(policies_absent)
    yield policies_absent


async def _status(api: Any, method: str, path: str, body: Any = None) -> int:
    try:
        await api.call_api(path, method, body=body, header_params={"Content-Type": "application/json"},
                           auth_settings=["BearerToken"])  # fmt: skip
    except ApiException as exc:
        return int(exc.status)
    return 200


async def test_the_servers_account_may_neither_write_policies_nor_read_any_configmap(
    policies_absent: KubeScope,
) -> None:
    """Least privilege: the chart's RBAC lets the server write only the parameters. A policy write
    or a read of another ConfigMap is refused (403); reading the chart's policies by name is not."""
    scope = policies_absent
    ns = await scope.namespace("other")
    await scope.create({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "secretish", "namespace": ns},
                        "data": {"k": "v"}})  # fmt: skip
    mutating = policy_objects("v1")[0]
    api = await scope.webhook_api_client()
    try:
        assert await _status(api, "POST", object_path(mutating, named=False), mutating) == 403
        assert await _status(api, "GET", f"/api/v1/namespaces/{ns}/configmaps/secretish") == 403
        assert await _status(api, "GET", object_path(mutating)) == 404  # may read it by name: not installed
        await _install_policies(scope)
        assert await _status(api, "GET", object_path(mutating)) == 200
        assert await _status(api, "DELETE", object_path(mutating)) == 403
    finally:
        await api.close()


async def test_without_the_charts_policies_the_leader_labels_no_namespace(
    policies_absent: KubeScope, tmp_path: Path
) -> None:
    """`helm template` without the cluster's API versions leaves the policies out: a namespace
    labelled for bindings that do not exist would be skipped by the webhooks and decided by
    nothing. The leader writes nothing until the chart's objects are there, then catches up."""
    scope = policies_absent
    await scope.settings()
    churn = await scope.namespace("churn")
    runtime, _, _ = await start_runtime(tmp_path, scope, admission_policies=True)

    async def labelled() -> bool:
        found = await scope.get("v1", "Namespace", churn)
        return (found or {})["metadata"].get("labels", {}).get(ADMISSION_POLICIES_LABEL) == "on"

    try:
        await eventually(lambda: runtime.policies.passes > 0, within_s=30, message="no pass")
        assert not await labelled()
        assert await scope.get("v1", "ConfigMap", PARAMS_NAME, churn) is None
        await _install_policies(scope)
        runtime.policies.resync_soon()
        await eventually(labelled, within_s=15, message="not labelled once the policies are installed")
        assert await scope.get("v1", "ConfigMap", PARAMS_NAME, churn) is not None
        # The policies taken away (helm uninstall, or an upgrade without them): label and parameters go.
        await _delete_policies(scope)
        runtime.policies.resync_soon()
        await eventually(lambda: not_(labelled()), within_s=15, message="still labelled without the policies")

        async def params_gone() -> bool:
            return await scope.get("v1", "ConfigMap", PARAMS_NAME, churn) is None

        await eventually(params_gone, within_s=15, message="parameters left without the policies")
    finally:
        await runtime.shutdown()


async def not_(check: Any) -> bool:
    return not await check


async def _refused(scope: KubeScope, ns: str) -> str | None:
    """A plain pod's refusal message; None when it was admitted (and is deleted again)."""
    pod = _pod(ns, f"closed-{time.monotonic_ns()}")
    try:
        await scope.create(pod)
    except ApiException as exc:
        return str(json.loads(exc.body).get("message", ""))
    await scope.delete("v1", "Pod", pod["metadata"]["name"], ns)
    return None


class Creator:
    """Creates pods one after another in a namespace, recording (sent, class or refusal)."""

    def __init__(self, scope: KubeScope, ns: str) -> None:
        self.scope = scope
        self.ns = ns
        self.created: list[tuple[float, str]] = []  # (sent, outcome)
        self.answered: list[float] = []
        self._task: asyncio.Task[None] | None = None

    async def create_one(self) -> str:
        sent = time.monotonic()
        try:
            stored = await self.scope.create(_pod(self.ns, f"p{time.monotonic_ns()}"))
            outcome = str(stored["spec"].get("priorityClassName"))
        except ApiException as exc:
            outcome = "refused: " + str(json.loads(exc.body).get("message", ""))
        self.created.append((sent, outcome))
        self.answered.append(time.monotonic())
        return outcome

    async def _loop(self) -> None:
        while True:
            await self.create_one()

    async def __aenter__(self) -> Creator:
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def until(self, outcome: Callable[[str], bool], since: float, within_s: float = 30.0) -> str:
        """Waits for the first pod sent after `since` with `outcome`; says when it was sent and
        answered, and when the last pod without it was answered, in seconds from `since`."""

        def seen() -> float | None:
            return next((sent for sent, got in self.created if sent >= since and outcome(got)), None)

        try:
            first = await eventually(seen, within_s=within_s, interval_s=0.02)
        except AssertionError:
            raise AssertionError(f"never seen in {self.ns}; the last pods: {self.after(since)[-3:]}") from None
        index = next(i for i, (sent, _) in enumerate(self.created) if sent == first)
        before = [self.answered[i] for i, (_, got) in enumerate(self.created[:index]) if not outcome(got)]
        last_without = f"{max(before) - since:+.3f} s" if before else "none"
        return (
            f"first pod with it sent {first - since:+.3f} s, answered {self.answered[index] - since:+.3f} s; "
            f"last pod without it answered {last_without}"
        )

    def after(self, since: float) -> list[str]:
        return [got for sent, got in self.created if sent >= since]


async def test_the_leader_keeps_the_policies_in_step_with_settings_and_projects(
    policies_cleared: KubeScope, tmp_path: Path, pytestconfig: pytest.Config
) -> None:
    scope = policies_cleared
    await scope.settings()
    churn = await scope.namespace("churn")
    runtime, _, _ = await start_runtime(tmp_path, scope, admission_policies=True)
    figures: list[str] = []
    try:
        assert await eventually(lambda: runtime.policies.passes > 0, within_s=30, message="no pass")
        await eventually(lambda: scope.get("v1", "ConfigMap", PARAMS_NAME, churn), within_s=10)
        creator = Creator(scope, churn)

        async def default_applied() -> bool:
            return await creator.create_one() == "normal"

        # The apiserver loads new policies from its informers: pods get the default class once it has.
        await eventually(default_applied, within_s=30, interval_s=0.1, message="the policies never applied")
        async with creator:
            # The settings: a new default class for every project that does not choose its own.
            changed: dict[str, Any] = copy.deepcopy(SCHEDULER)
            changed["defaults"]["priorityClass"] = "batch"
            await asyncio.sleep(0.5)
            await scope.settings(scheduler=changed)
            written = time.monotonic()
            took = await creator.until(lambda c: c == "batch", written)
            await asyncio.sleep(1.0)
            first_new = next(i for i, (sent, c) in enumerate(creator.created) if sent >= written and c == "batch")
            assert set(c for _, c in creator.created[first_new:]) == {"batch"}  # stable once seen
            figures.append(f"settings (new default class), from the write's answer: {took}")

            # The project's own annotation: its default class.
            offer = {"priorityClasses": ["batch", "urgent"]}
            annotations = {
                AVAILABLE_ANNOTATION: json.dumps(offer),
                DEFAULTS_ANNOTATION: json.dumps({"priorityClass": "urgent"}),
            }
            await scope.patch("v1", "Namespace", churn, {"metadata": {"annotations": annotations}})
            written = time.monotonic()
            took = await creator.until(lambda c: c == "urgent", written)
            figures.append(f"project annotation (its own default class), from the patch's answer: {took}")

        # A new project: its pods are left alone (here: no webhook) until the leader has written its
        # parameters and labelled it for the bindings; never refused for want of parameters.
        fresh = await scope.namespace("fresh")
        created = time.monotonic()
        newcomer = Creator(scope, fresh)
        async with newcomer:
            took = await newcomer.until(lambda c: c == "batch", created, within_s=60)  # the settings' default now
        outcomes = newcomer.after(created)
        assert not [c for c in outcomes if c.startswith("refused")], outcomes
        assert (await scope.get("v1", "Namespace", fresh) or {})["metadata"]["labels"][ADMISSION_POLICIES_LABEL] == "on"
        figures.append(f"new project, from the namespace's creation: {took}")

        # Settings under which the webhook adds to a plain pod (the priority class subset in warn
        # mode: its warning): the projects lose the label first, and the policies leave their pods.
        async def labelled(ns: str) -> bool:
            found = await scope.get("v1", "Namespace", ns)
            return (found or {})["metadata"].get("labels", {}).get(ADMISSION_POLICIES_LABEL) == "on"

        await scope.settings(scheduler=changed, priority_class_enforcement="warn")
        await eventually(lambda: not_(labelled(churn)), within_s=10, message="still labelled in warn mode")
        assert await Creator(scope, churn).create_one() == "None"  # no webhook here to decide
        await scope.settings(scheduler=changed)
        await eventually(lambda: labelled(churn), within_s=10, message="not labelled again")

        # A namespace that stops being a project loses its parameters.
        await scope.patch("v1", "Namespace", fresh, {"metadata": {"labels": {"hopsworks.ai/project": None}}})

        async def params_gone() -> bool:
            return await scope.get("v1", "ConfigMap", PARAMS_NAME, fresh) is None

        await eventually(params_gone, within_s=10, message="the parameters of a former project stayed")

        # Deleted behind the leader's back (with its own credentials: the admin may not either),
        # written again at the next resync.
        await runtime.policies.kube.delete_object("ConfigMap", PARAMS_NAME, churn)
        runtime.policies.resync_soon()
        await eventually(lambda: scope.get("v1", "ConfigMap", PARAMS_NAME, churn), within_s=10)
    finally:
        await runtime.shutdown()

    # Fail closed: with the server stopped, a project whose parameters went missing refuses a
    # plain pod, and the refusal names the cause.
    api = await scope.webhook_api_client()
    try:
        await KubeApi(api, scope.install_ns).delete_object("ConfigMap", PARAMS_NAME, churn)
    finally:
        await api.close()
    outcome = await eventually(lambda: _refused(scope, churn), within_s=10, message="a pod admitted without parameters")
    assert "no params found" in outcome and "Deny" in outcome, outcome
    figures.append(f"parameters missing, server down: {outcome}")
    reporter = pytestconfig.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        for line in figures:
            reporter.write_line(f"policy writer: {line}")
