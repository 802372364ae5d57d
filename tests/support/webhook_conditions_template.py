"""The chart's pod webhook conditions, manifests/chart/templates/_webhook_conditions.tpl, generated
from `webhook.core.webhook_conditions`.

`make manifests` writes it (`python -m tests.support.webhook_conditions_template`);
tests/test_chart.py fails when it is not what the module makes. The template defines
"sw.needsThePodWebhooks", which the webhook configurations include with `decided` true (the
namespaces the compiled policies decide) or false.
"""

from __future__ import annotations

from tests.support import peers
from webhook.core.webhook_conditions import CONDITION_NAME, needs_the_pod_webhooks

TEMPLATE = peers.REPO / "manifests" / "chart" / "templates" / "_webhook_conditions.tpl"
_INDENT = " " * 6  # the folded scalar's lines, under `expression: >-`


def _folded(expression: str) -> str:
    if "{{" in expression or "\n\n" in expression:
        raise ValueError("the condition would start a Helm action or break the folded scalar")
    return "".join(f"\n{_INDENT}{line}" for line in expression.splitlines())


def current() -> str:
    return (
        "{{- /*\n"
        "Generated from webhook/core/webhook_conditions.py by `make manifests`\n"
        "(tests/support/webhook_conditions_template.py): edit the module, not this file.\n"
        "The pods a pod webhook must see; `decided`: in the namespaces the compiled policies decide.\n"
        "*/}}\n"
        '{{- define "sw.needsThePodWebhooks" -}}\n'
        "matchConditions:\n"
        f"  - name: {CONDITION_NAME}\n"
        "    expression: >-\n"
        "{{- if .decided }}"
        f"{_folded(needs_the_pod_webhooks(decided=True))}\n"
        "{{- else }}"
        f"{_folded(needs_the_pod_webhooks(decided=False))}\n"
        "{{- end }}\n"
        "{{- end -}}\n"
    )


if __name__ == "__main__":
    TEMPLATE.write_text(current())
    print(TEMPLATE.relative_to(peers.REPO))
