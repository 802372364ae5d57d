"""A stand-in for the closed part of Run:ai's admission: it hands pods to Run:ai's scheduler.

Run:ai's webhooks (configurations named `runai-*`) select pods by the namespace label `runai/queue`.
The part of them that is open is KAI-Scheduler's admission, which runs for real beside it
(tests/support/control_plane/kai.py: GPU-sharing mutation and validation). The part that is not,
and that KAI's admission does not do, is played here: it sets `spec.schedulerName: runai-scheduler`
and records each review it got, so a test can tell whether a stored pod went through Run:ai's
admission. It is registered like Run:ai's, through its own MutatingWebhookConfiguration whose name
sorts after ours and KAI's (KAI's mutating webhook is reinvoked once this one has set the name), and
served over HTTPS with its own CA.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from aiohttp import web

RUNAI_SCHEDULER = "runai-scheduler"
SERVICE = "runai-admission"
NAMESPACE = "runai"
CONFIGURATION = "runai-mutating-webhook"
WEBHOOK = "pod-mutator.run.ai"


class RunaiAdmissionStandin:
    def __init__(self) -> None:
        self.reviews: list[dict[str, Any]] = []  # the AdmissionRequests received

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/pod-mutation", self._mutate)
        return app

    async def _mutate(self, request: web.Request) -> web.Response:
        review = await request.json()
        self.reviews.append(review["request"])
        patch = [{"op": "add", "path": "/spec/schedulerName", "value": RUNAI_SCHEDULER}]
        response = {
            "uid": review["request"]["uid"],
            "allowed": True,
            "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps(patch).encode()).decode(),
        }
        return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})

    def pods_seen(self, namespace: str) -> list[dict[str, Any]]:
        return [r["object"] for r in self.reviews if r.get("namespace") == namespace]

    @staticmethod
    def configuration(ca_pem: bytes) -> dict[str, Any]:
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": CONFIGURATION},
            "webhooks": [
                {
                    "name": WEBHOOK,
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "reinvocationPolicy": "Never",
                    "timeoutSeconds": 5,
                    "clientConfig": {
                        "caBundle": base64.b64encode(ca_pem).decode(),
                        "service": {"name": SERVICE, "namespace": NAMESPACE, "path": "/pod-mutation", "port": 443},
                    },
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                            "scope": "Namespaced",
                        }
                    ],
                    "namespaceSelector": {"matchExpressions": [{"key": "runai/queue", "operator": "Exists"}]},
                }
            ],
        }
