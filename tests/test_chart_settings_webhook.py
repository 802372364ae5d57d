"""The chart's settings webhook as the real apiserver applies it: which writes of the settings
ConfigMap it sends to the server, judged by the apiserver's own evaluation of its matchConditions.

The webhook's Service does not exist here, so a request the configuration sends is refused with
the apiserver's "failed calling webhook" and one it skips goes through: exactly what decides
whether Helm 3's uninstall, which deletes the Service before the ConfigMap and the webhook
configurations last, can delete the ConfigMap.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests.support import chart
from tests.support.kube_scope import KubeScope, eventually
from webhook.settings import SETTINGS_CONFIGMAP

HOOK = "validate-settings.scheduling.hopsworks.ai"


class Caller:
    """Plain HTTPS to the apiserver with one identity's token: each answer as status and body."""

    def __init__(self, scope: KubeScope, token: str) -> None:
        ctx = ssl.create_default_context(cafile=str(scope.cp.pki.ca_file))
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx))
        self.url = f"{scope.cp.url}/api/v1/namespaces/{scope.install_ns}/configmaps/{SETTINGS_CONFIGMAP}"
        self.headers = {"Authorization": f"Bearer {token}"}

    async def delete(self) -> tuple[int, Any]:
        # A dry run is sent to a webhook with sideEffects None like a real one, and the ConfigMap stays
        # for the next caller.
        async with self.session.delete(self.url, params={"dryRun": "All"}, headers=self.headers) as resp:
            return resp.status, await resp.json()

    async def update(self) -> tuple[int, Any]:
        patch = {"data": {"run_ai_enable": "false"}}
        headers = {**self.headers, "Content-Type": "application/merge-patch+json"}
        async with self.session.patch(self.url, params={"dryRun": "All"}, json=patch, headers=headers) as resp:
            return resp.status, await resp.json()


@pytest.fixture
async def callers(kube_scope: KubeScope) -> AsyncIterator[dict[str, Caller]]:
    """An installer named by user name, one named through a group, and someone else, each allowed
    by RBAC to delete and patch the install namespace's ConfigMaps; the settings ConfigMap; and the
    chart's settings webhook (alone, under the test's name) in front of it, in force."""
    scope = kube_scope
    team = await scope.namespace("installers", project=False)
    identities = {
        "installer": await scope.user_token("installer"),
        "installer-group": await scope.user_token("member", team),
        "other": await scope.user_token("other"),
    }
    for user, _ in identities.values():
        for verb in ("delete", "patch"):
            await scope.allow(user, verb, "configmaps", scope.install_ns)
    await scope.settings()

    installers = [identities["installer"][0], f"group:system:serviceaccounts:{team}"]
    rendered = chart.render({"installers": installers}, scope.install_ns)
    (configuration,) = [o for o in rendered if o["kind"] == "ValidatingWebhookConfiguration"
                        and any(h["name"] == HOOK for h in o["webhooks"])]  # fmt: skip
    configuration["metadata"] = {"name": scope.name("settings-guard")}
    configuration["webhooks"] = [h for h in configuration["webhooks"] if h["name"] == HOOK]
    await scope.create(configuration)

    made = {who: Caller(scope, token) for who, (_, token) in identities.items()}
    try:
        other = made["other"]

        async def guarded() -> bool:
            status, body = await other.delete()
            return status >= 500 and HOOK in body.get("message", "")

        await eventually(guarded, within_s=60, interval_s=0.2, message="the settings webhook in force")
        yield made
    finally:
        for caller in made.values():
            await caller.session.close()


async def test_an_installers_delete_of_the_settings_skips_the_webhook(callers: dict[str, Caller]) -> None:
    # The server allows an installer's DELETE whatever the settings hold (G2), so the apiserver need
    # not ask it, and an uninstall that has deleted the Service first still deletes the ConfigMap.
    for who in ("installer", "installer-group"):
        status, body = await callers[who].delete()
        assert status == 200 and body.get("status") != "Failure", (who, body)


async def test_everyone_elses_delete_and_every_update_still_reach_the_webhook(callers: dict[str, Caller]) -> None:
    status, body = await callers["other"].delete()
    assert status >= 500 and HOOK in body["message"], body
    for who in ("installer", "installer-group", "other"):
        status, body = await callers[who].update()
        assert status >= 500 and HOOK in body["message"], (who, body)
