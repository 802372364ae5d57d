"""`kubectl hopsworks` without a cluster: how the aggregated API reads the apiserver's front-proxy
configuration and the user it names, and how the plugin prints answers and picks its exit code.
Against the real apiserver: tests/e2e/test_kubectl_plugin.py."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from multidict import CIMultiDict, CIMultiDictProxy

from webhook.http.aggregated_api import NoRequestHeaderConfig, proxied_user, requestheader_config
from webhook.kubectl_plugin import Answer, _show, context_namespace, gpu_table, main, move_text

ROOT = Path(__file__).resolve().parents[1]
CA = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
# As kube-apiserver publishes it with the test control plane's flags (and kubeadm's).
PUBLISHED = {
    "client-ca-file": CA,
    "requestheader-client-ca-file": CA,
    "requestheader-allowed-names": '["front-proxy-client"]',
    "requestheader-username-headers": '["X-Remote-User"]',
    "requestheader-group-headers": '["X-Remote-Group"]',
    "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
}


def headers(*pairs: tuple[str, str]) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict(pairs))


def test_the_published_configuration_is_read_as_the_apiserver_writes_it() -> None:
    config = requestheader_config(PUBLISHED)
    assert config.client_ca.strip() == CA
    assert config.allowed_names == ("front-proxy-client",)
    assert config.username_headers == ("X-Remote-User",) and config.extra_prefixes == ("X-Remote-Extra-",)
    with pytest.raises(NoRequestHeaderConfig, match="--requestheader-client-ca-file"):
        requestheader_config({"client-ca-file": CA})
    with pytest.raises(ValueError, match="requestheader-allowed-names: not a JSON list"):
        requestheader_config({**PUBLISHED, "requestheader-allowed-names": "front-proxy-client"})


@pytest.mark.parametrize(
    ("pairs", "expected"),
    [
        # Every group header counts; extra keys are unescaped and lower-cased, as the apiserver's
        # requestheader authenticator reads them.
        (
            [("X-Remote-User", "alice"), ("X-Remote-Group", "system:authenticated"), ("x-remote-group", "admins"),
             ("X-Remote-Extra-Authentication.kubernetes.io%2fcredential-Id", "X509SHA256=ab")],
            ("alice", ("system:authenticated", "admins"),
             {"authentication.kubernetes.io/credential-id": ("X509SHA256=ab",)}),
        ),
        ([("X-Remote-User", ""), ("X-Remote-User", "bob")], ("bob", (), {})),  # the first non-empty one
        ([("X-Remote-Group", "admins")], None),  # no user: none
        ([("Authorization", "Bearer t"), ("X-Forwarded-User", "eve")], None),  # other headers name no one
    ],
)  # fmt: skip
def test_the_user_is_read_from_the_configured_headers(pairs: list[tuple[str, str]], expected: Any) -> None:
    user = proxied_user(headers(*pairs), requestheader_config(PUBLISHED))
    if expected is None:
        assert user is None
    else:
        assert user is not None and (user.username, user.groups, dict(user.extra)) == expected


GPU_VIEW = {
    "namespace": "churn", "status": "OK", "runai_enabled": True,
    "project": {"name": "churn", "quota": 4.0, "allocated": 3.0},
    "department": {"name": "ml"}, "available_non_preemptible": 1.0, "available_preemptible": 2.5,
    "pod_gpus": {"non_preemptible": 3.0, "preemptible": 0.0},
    "warnings": [{"code": "RUN_AI_DEPARTMENT_DRIFT", "message": "in the wrong department"}],
}  # fmt: skip
FORBIDDEN = {
    "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden", "code": 403,
    "message": 'projectviews.scheduling.hopsworks.ai "gpu" is forbidden: User "bob" cannot get resource "projectviews"',
}  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "output", "code", "printed", "said"),
    [
        (Answer(200, GPU_VIEW), "table", 0, "\nchurn ", ""),
        (Answer(200, GPU_VIEW), "json", 0, '"available_preemptible": 2.5', ""),
        (Answer(200, GPU_VIEW), "yaml", 0, "available_non_preemptible: 1.0", ""),
        # RBAC's refusal, as the apiserver words it: refused.
        (Answer(403, FORBIDDEN), "table", 1, "", "Error from server (Forbidden): projectviews"),
        # The server's refusal of an action: refused, with the pods that stop it.
        (Answer(409, {"error": "churn has 1 running pod", "code": "ProjectBusy", "pods": ["nb-0"]}), "table", 1, "",
         "pods running or waiting: nb-0"),
        # Not a project, an apiserver without the APIService, a server not answering: bad input or no answer.
        (Answer(404, {"error": "x is not a project namespace", "code": "NotFound"}), "table", 2, "", "(NotFound)"),
        (Answer(404, {"kind": "Status", "reason": "NotFound", "message": "the server could not find the resource"}),
         "table", 2, "", "aggregatedApi.enabled"),
        (Answer(503, {"kind": "Status", "reason": "ServiceUnavailable", "message": "service unavailable"}), "table", 2,
         "", "kubectl get apiservice v1.scheduling.hopsworks.ai"),
    ],
)  # fmt: skip
def test_answers_print_as_kubectl_prints_and_exit_by_outcome(
    answer: Answer, output: str, code: int, printed: str, said: str
) -> None:
    out, err = io.StringIO(), io.StringIO()
    assert _show(answer, output, gpu_table, out, err) == code
    assert printed in out.getvalue() and said in err.getvalue(), (out.getvalue(), err.getvalue())
    if output == "json":
        assert json.loads(out.getvalue()) == GPU_VIEW
    if output == "yaml":
        assert yaml.safe_load(out.getvalue()) == GPU_VIEW


def test_the_gpu_table_has_kubectls_shape() -> None:
    header, row, warning = gpu_table(GPU_VIEW).splitlines()
    assert header.split() == ["PROJECT", "STATUS", "DEPARTMENT", "DESERVED", "ALLOCATED", "AVAILABLE",
                              "AVAILABLE-PREEMPTIBLE", "PODS-NON-PREEMPTIBLE", "PODS-PREEMPTIBLE"]  # fmt: skip
    assert row.split() == ["churn", "OK", "ml", "4", "3", "1", "2.5", "3", "0"]
    assert warning == "Warning: RUN_AI_DEPARTMENT_DRIFT: in the wrong department"


def test_a_dry_run_delete_says_what_would_move() -> None:
    text = move_text({"message": "department ml: 1 project(s) would move", "moved": [
        {"namespace": "churn", "outcome": "moved", "dry_run": True}]})  # fmt: skip
    assert text.splitlines() == ["department ml: 1 project(s) would move", "  would move: churn (moved)"]


def test_the_namespace_is_the_contexts_as_kubectl_takes_it(tmp_path: Path) -> None:
    config = {
        "apiVersion": "v1", "kind": "Config", "current-context": "a",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "a", "context": {"cluster": "c", "user": "u", "namespace": "churn"}},
                     {"name": "b", "context": {"cluster": "c", "user": "u"}}],
    }  # fmt: skip
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    assert context_namespace(str(path), None) == "churn"
    assert context_namespace(str(path), "b") == "default"
    assert main(["gpu", "--kubeconfig", str(path), "--context", "nosuch"]) == 2


def test_the_offline_review_exits_as_scheduling_webhook_review(capsys: pytest.CaptureFixture[str]) -> None:
    state = ["--state", str(ROOT / "examples/cluster")]
    assert main(["review", "-f", str(ROOT / "examples/requests/notebook-pod.yaml"), *state]) == 0
    assert "decision: ALLOWED" in capsys.readouterr().out
    assert main(["review", "-f", str(ROOT / "examples/requests/refused-priority.json"), *state, "-o", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["allowed"] is False
