"""The admission handlers the real Runtime serves, in folder mode and against an apiserver: every
handler is built once (`webhook.http.handlers.admission_handlers`), so the served settings guard
knows the configured installer identities in both modes."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import settings_configmap
from tests.support.https import LOOPBACK, CertFiles, free_port, make_cert_files
from tests.support.kube_scope import scope_on
from tests.support.runtime import apiserver_session, base_url, start_runtime
from webhook.runtime import Runtime, ServeOptions

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "cluster"
INSTALLER = "system:serviceaccount:hopsworks:hopsworks-installer"


def enable_runai_review(username: str, install_ns: str) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"enable-runai-{username}",
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "operation": "UPDATE",
            "name": "hopsworks-cluster-settings",
            "namespace": install_ns,
            "userInfo": {"username": username},
            "object": settings_configmap(install_ns, run_ai_enable=True),
            "oldObject": settings_configmap(install_ns, run_ai_enable=False),
        },
    }


@pytest.fixture(params=["folder", "cluster"])
async def served(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tuple[ServeOptions, CertFiles]]:
    if request.param == "folder":
        state = tmp_path / "state"
        shutil.copytree(EXAMPLES, state)
        certs = make_cert_files(tmp_path / "certs")
        options = ServeOptions(
            host=LOOPBACK,
            port=free_port(),
            certs=certs.dir,
            state_dir=state,
            installers=(INSTALLER,),
            drain_seconds=0.0,
            linger_seconds=0.0,
        )
        runtime = Runtime(options)
        await runtime.start()
        try:
            yield options, certs
        finally:
            await runtime.shutdown()
        return
    async with scope_on(request.getfixturevalue("shared_control_plane"), tmp_path / "kube-scope") as scope:
        await scope.settings()
        runtime, options, certs = await start_runtime(tmp_path, scope, installers=(INSTALLER,))
        try:
            yield options, certs
        finally:
            await runtime.shutdown()


async def test_served_settings_guard_knows_the_configured_installers(
    served: tuple[ServeOptions, CertFiles],
) -> None:
    options, certs = served
    async with apiserver_session(certs) as session:
        answers = {}
        for user in (INSTALLER, "platform-admin"):
            review = enable_runai_review(user, options.namespace)
            async with session.post(f"{base_url(options)}/validate/settings", json=review) as resp:
                assert resp.status == 200
                answers[user] = (await resp.json())["response"]
    assert answers[INSTALLER]["allowed"], answers[INSTALLER]
    refused = answers["platform-admin"]
    assert not refused["allowed"]
    assert "is not an installer identity" in refused["status"]["message"]
    assert "no installer identities are configured" not in refused["status"]["message"]
