"""One error hierarchy for the Kubernetes API: the Status message when there is one, else the reason."""

from __future__ import annotations

import pytest

from webhook.kube.api import KubeConflict, KubeError, KubeNotFound, kube_error


@pytest.mark.parametrize(
    ("status", "body", "reason", "cls", "message"),
    [
        (
            404,
            '{"kind": "Status", "message": "namespaces \\"x\\" not found"}',
            "Not Found",
            KubeNotFound,
            'namespaces "x" not found',
        ),
        (
            409,
            b'{"kind": "Status", "message": "the object has been modified"}',
            "",
            KubeConflict,
            "the object has been modified",
        ),
        (500, None, "Internal Server Error", KubeError, "Internal Server Error"),
        # kubernetes_asyncio's ApiException carries the body as bytes: shown as text, not as b'...'
        (502, b"upstream connect error", "", KubeError, "upstream connect error"),
    ],
)
def test_the_message_is_the_status_message_else_the_reason_else_the_body(
    status: int, body: str | bytes | None, reason: str, cls: type[KubeError], message: str
) -> None:
    error = kube_error(status, body, reason)
    assert type(error) is cls and str(error) == f"{status}: {message}"
