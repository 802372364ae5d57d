"""What the pod cache keeps of a pod (`slim_pod`): the same records as the pod applied whole."""

from __future__ import annotations

import copy
from typing import Any

from bench.cold_start import stored_pod
from tests.support.cluster import priority_class, settings_configmap
from webhook.state.store import ClusterState
from webhook.state.watches import slim_pod

NS = "vision"


def new_state() -> ClusterState:
    state = ClusterState("hopsworks")
    state.apply(settings_configmap())
    state.apply(priority_class("normal", 10000))
    return state


def test_a_gpu_sidecar_counts_beside_the_app_containers() -> None:
    # Slimming once dropped restartPolicy, so a cached pod's GPU sidecar was counted as an init
    # container that ends before the app starts: 1 GPU held where the pod holds 2.
    pod: dict[str, Any] = {"kind": "Pod", **stored_pod(7, NS, True)}
    pod["spec"]["initContainers"] = [
        {"name": "proxy", "restartPolicy": "Always", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
        {"name": "init", "resources": {"limits": {"nvidia.com/gpu": "1"}}},
    ]
    state = new_state()
    state.apply(slim_pod(copy.deepcopy(pod)))
    [record] = state.pods[NS].values()
    assert record.gpus == 2.0
