"""Warn before enforce (`core.enforcement`), as a table, and through the served handlers."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import cluster_state, namespace
from tests.support.reviews import pod_review
from webhook.core.decision import Decision, Reason
from webhook.core.enforcement import WOULD_REFUSE_AUDIT, as_warning, warned_family
from webhook.core.guard_config import GuardConfig
from webhook.http.handlers import admission_handlers
from webhook.metrics import WOULD_REFUSE, WOULD_REFUSE_RECENT, WOULD_REFUSE_WINDOW_S, WouldRefuse
from webhook.settings import ClusterSettings
from webhook.snapshot import RunaiProjectInfo

EXAMPLE_CLUSTER = Path(__file__).resolve().parents[1] / "examples" / "cluster"
OVER = Decision.deny("project vision has 1 of 2 deserved GPUs left; ...", 403, Reason.GPU_QUOTA_EXCEEDED)

CASES = [
    # (id, decision, gpu_quota_enforcement, the family warned or None)
    ("quota refusal, enforce", OVER, "enforce", None),
    ("quota refusal, warn", OVER, "warn", "gpu-quota"),
    ("allowed, warn", Decision.allow(), "warn", None),
    ("a subset refusal is no quota refusal", Decision.deny("priority class x not available", 403), "warn", None),
    ("queue missing stays enforced", Decision.deny("lacks runai/queue", 403, Reason.RUNAI_QUEUE_MISSING), "warn", None),
    ("unproven reservation stays enforced", Decision.deny("?", 503, Reason.GPU_QUOTA_UNPROVEN), "warn", None),
    ("a bad object stays a 400", Decision.deny("cannot read", 400, Reason.BAD_REQUEST), "warn", None),
]


@pytest.mark.parametrize(("decision", "mode", "family"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_which_refusals_warn(decision: Decision, mode: str, family: str | None) -> None:
    settings = ClusterSettings.from_configmap_data({"gpu_quota_enforcement": mode})
    assert warned_family(decision, settings) == family


def test_a_warned_refusal_is_admitted_with_its_message_as_warning_and_audit() -> None:
    refused = Decision.deny(OVER.message, OVER.code, Reason.GPU_QUOTA_EXCEEDED, warnings=["earlier"])
    warned = as_warning(refused, "gpu-quota")
    assert warned.allowed and warned.patch == ()
    assert warned.warnings == (
        "earlier",
        f"admitted because gpu_quota_enforcement is warn; with enforce this is refused: {OVER.message}",
    )
    assert warned.audit == {WOULD_REFUSE_AUDIT: f"gpu-quota: {OVER.message}"}


def test_the_setting_takes_only_enforce_or_warn() -> None:
    from webhook.settings import SettingsError

    assert ClusterSettings().gpu_quota_enforcement == "enforce"
    with pytest.raises(SettingsError, match="gpu_quota_enforcement"):
        ClusterSettings.from_configmap_data({"gpu_quota_enforcement": "audit"})


def over_quota_state(mode: str) -> Any:
    bound = namespace("vision", labels={"runai/queue": "vision", "hopsworks.ai/runai-project-id": "7"})
    state = cluster_state(namespaces=[bound], run_ai_enable=True, gpu_quota_enforcement=mode)
    state.snapshot().runai_projects = {
        "vision": RunaiProjectInfo(id="7", name="vision", namespace="vision", deserved_gpus=2, node_pool="default",
                                   allocated_non_preemptible=1, sampled_at=0)
    }  # fmt: skip
    return state


def notebook_review(dry_run: bool = False) -> dict[str, Any]:
    labels = {"jupyter": "true", "runai/queue": "vision", "kai.scheduler/preemptibility": "non-preemptible"}
    return pod_review("vision", labels=labels, gpus=2, dry_run=dry_run)["request"]


def test_the_served_pod_validation_warns_counts_and_lists_the_project() -> None:
    def counted() -> float:
        return WOULD_REFUSE.labels("gpu-quota", "vision")._value.get()

    before = counted()
    enforce = admission_handlers(over_quota_state("enforce"), GuardConfig(install_namespace="hopsworks"))
    refused = asyncio.run(enforce["/validate/pods"](notebook_review()))
    assert not refused.allowed and refused.reason == Reason.GPU_QUOTA_EXCEEDED
    warn = admission_handlers(over_quota_state("warn"), GuardConfig(install_namespace="hopsworks"))
    admitted = asyncio.run(warn["/validate/pods"](notebook_review()))
    assert admitted.allowed and admitted.audit[WOULD_REFUSE_AUDIT].startswith("gpu-quota: project vision has 1 of 2")
    assert counted() == before + 1
    assert asyncio.run(warn["/validate/pods"](notebook_review(dry_run=True))).allowed
    assert counted() == before + 1  # a dry run keeps nothing out of the cluster: not counted
    assert any(p == "vision" and rule == "gpu-quota" for p, rule, _, _ in WOULD_REFUSE_RECENT.recent(time.time()))


def test_the_recent_list_keeps_an_hour() -> None:
    recent = WouldRefuse()
    recent.record("gpu-quota", "a", 100.0)
    recent.record("gpu-quota", "a", 200.0)
    recent.record("gpu-quota", "b", 150.0)
    assert recent.recent(300.0) == [("a", "gpu-quota", 2, 200.0), ("b", "gpu-quota", 1, 150.0)]
    assert recent.recent(150.0 + WOULD_REFUSE_WINDOW_S + 1) == [("a", "gpu-quota", 1, 200.0)]
    assert recent.recent(200.0 + WOULD_REFUSE_WINDOW_S + 1) == []


async def test_the_admin_view_and_console_list_projects_with_would_be_refusals(aiohttp_client: Any) -> None:
    from tests.support.apps import cache_app
    from webhook.local_mode import folder_mode_routes
    from webhook.state.folder import load_into
    from webhook.state.store import ClusterState

    folder = EXAMPLE_CLUSTER
    state = ClusterState("hopsworks")
    load_into(state, folder)
    client = await aiohttp_client(cache_app(state, routes=folder_mode_routes(state, folder, "127.0.0.1")))
    local = {"Host": "localhost"}
    WOULD_REFUSE_RECENT.record("gpu-quota", "fraud-detection", time.time())
    resp = await client.get("/api/v1/admin/runai", headers=local)
    assert resp.status == 200, await resp.text()
    # The record of recent would-be refusals is the process's: earlier tests may have added other rules.
    listed = (await resp.json())["would_refuse"]
    rows = [r for r in listed if r["project"] == "fraud-detection" and r["rule"] == "gpu-quota"]
    assert len(rows) == 1 and rows[0]["count"] >= 1
    page = await (await client.get("/ui/admin/", headers=local)).text()
    assert 'id="would-refuse"' in page and '<tr data-project="fraud-detection">' in page
