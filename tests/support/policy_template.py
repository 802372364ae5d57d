"""The chart's compiled admission policies, manifests/chart/templates/14-admission-policies.yaml,
generated from `webhook.core.admission_policies.policy_objects`.

`make manifests` writes it (`python -m tests.support.policy_template`); tests/test_chart.py fails
when it is not what the compiler makes. The policies and bindings are the same in every cluster,
so the installer writes them with the chart and the server only writes their parameters: the
rights to write an admission policy, and to `get` every ConfigMap (which a policy whose paramKind
is ConfigMap demands of its writer), stay with whoever installs the chart.
"""

from __future__ import annotations

from typing import Any

import yaml

from tests.support import peers
from webhook.core.admission_policies import GROUP, policy_objects

TEMPLATE = peers.REPO / "manifests" / "chart" / "templates" / "14-admission-policies.yaml"
# The chart renders the policies only where the apiserver serves this kind; `helm template`
# answers from Helm's built-in list of versions instead (docs/values.md, admissionPolicies.enabled).
SERVED = f"{GROUP}/v1/MutatingAdmissionPolicy"  # the kind "sw.policiesRendered" asks for (_helpers.tpl)
_LABELS = "__chart_labels__"
HEADER = """\
{{- /*
Generated from webhook/core/admission_policies.py by `make manifests`
(tests/support/policy_template.py): edit the compiler, not this file.
The policies and bindings are static: the installer writes them, so the server's ClusterRole
needs neither write on admission policies nor `get` on every ConfigMap (what the apiserver asks
of whoever writes a policy with ConfigMap parameters). The server writes only the parameters,
one ConfigMap scheduling-webhook-policy per project, and the namespace label the bindings select.
Nothing is rendered without the kind (a cluster before 1.36; `helm template` without
--api-versions): the server then leaves every pod to the webhooks.
*/}}
{{- if include "sw.policiesRendered" . }}
"""
FOOTER = "{{- end }}\n"


class _Dumper(yaml.SafeDumper):
    """Multi-line CEL as block text, so that the template reads as the compiler wrote it."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def _document(obj: dict[str, Any]) -> str:
    labelled = {**obj, "metadata": {**obj["metadata"], "labels": _LABELS}}
    text = yaml.dump(labelled, Dumper=_Dumper, sort_keys=False, width=120)
    if "{{" in text:
        raise ValueError(f"{obj['kind']}: '{{{{' would start a Helm template action")
    return text.replace(f"  labels: {_LABELS}\n", '  labels:\n    {{- include "sw.labels" . | nindent 4 }}\n')


def current() -> str:
    return HEADER + "".join(f"---\n{_document(o)}" for o in policy_objects("v1")) + FOOTER


if __name__ == "__main__":
    TEMPLATE.write_text(current())
    print(TEMPLATE.relative_to(peers.REPO))
