"""Rules S1-S3 and S5's queue label compiled for the apiserver: MutatingAdmissionPolicy and
ValidatingAdmissionPolicy objects, with their bindings, and one parameter ConfigMap per project.

The policies are the same for every project; what differs between projects is in the parameters,
and the parameters are computed here from the Python decision's own inputs (`core.namespace_plan`:
the offer, the default priority class with its value), so the CEL only applies what Python
decided. The policies cover a plain pod of a bound project namespace that chose no node labels
of its own (no affinity annotations): the webhook keeps every pod that names them, since reading
a `key=value` list and checking it against the subset is webhook work (`matchConditions`).

Parameter values are strings (a ConfigMap's data). Lists of node labels are written grouped by
key as `key=v1|v2;key2=v3`: `;`, `|` and `=` cannot appear in a label key or value, so CEL's
`split` reads them back without ambiguity.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from webhook.core.enforcement import PRIORITY_CLASS, warns
from webhook.core.namespace_plan import Grouped, NamespacePlan, namespace_plan
from webhook.snapshot import (
    ADMISSION_POLICIES_LABEL,
    AFFINITY_ANNOTATION,
    ANTI_AFFINITY_ANNOTATION,
    MIRROR_POD_ANNOTATION,
    PRIORITY_CLASS_ANNOTATION,
    PROJECT_LABEL,
    RUNAI_QUEUE_LABEL,
    ClusterSnapshot,
    NamespaceInfo,
    PriorityClassInfo,
)

# The name of every object this module makes (policies, bindings, and the ConfigMap in each project).
POLICY_NAME = "scheduling-webhook-pods"
PARAMS_NAME = "scheduling-webhook-policy"
GROUP = "admissionregistration.k8s.io"

_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


def encode_groups(groups: Grouped) -> str:
    """(key, values) groups -> `key=v1|v2;key2=v3` (empty: none)."""
    return ";".join(f"{key}={'|'.join(values)}" for key, values in groups)


def policy_params(plan: NamespacePlan, global_default: PriorityClassInfo | None) -> dict[str, str]:
    """The data of a project's parameter ConfigMap: what the policies apply to its plain pods."""
    settings = plan.settings
    offer = plan.offer
    default_class = plan.default_class
    return {
        "compiled": "true",
        "maxTerms": str(plan.max_terms),
        "affinityIn": encode_groups(plan.affinity_groups),
        "antiAffinityNotIn": encode_groups(plan.anti_affinity_groups),
        "priorityClassName": default_class.name if default_class else "",
        "priority": str(default_class.value) if default_class else "",
        "preemptionPolicy": default_class.preemption_policy if default_class else "",
        "globalDefaultClass": global_default.name if global_default else "",
        "allowedPriorityClasses": ",".join(offer.priority_classes),
        # Warn mode admits a class outside the subset with a warning the webhook words: not compiled.
        "enforcePriorityClasses": "false" if warns(settings, PRIORITY_CLASS) else "true",
        "runaiQueue": (plan.namespace.runai_queue or "") if settings.run_ai_enable else "",
    }


def params_config_map(namespace: str, data: Mapping[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": PARAMS_NAME,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "scheduling-webhook"},
        },
        "data": dict(data),
    }


def _has_annotation(key: str) -> str:
    return f"(has(object.metadata.annotations) && '{key}' in object.metadata.annotations)"


# Pods the policies take: those the webhook does not have to see for S1-S3.
MATCH_CONDITIONS = [
    {"name": "no-mirror-pod", "expression": f"!{_has_annotation(MIRROR_POD_ANNOTATION)}"},
    {
        "name": "no-node-label-choice",
        "expression": f"!{_has_annotation(AFFINITY_ANNOTATION)} && !{_has_annotation(ANTI_AFFINITY_ANNOTATION)}",
    },
]

_GROUPS = """params.data.{field} == '' ? [] : params.data.{field}.split(';').map(g, {{
  'key': dyn(g.split('=')[0]), 'operator': dyn('{operator}'), 'values': dyn(g.split('=')[1].split('|'))}})"""

_OWN_TERMS = (
    "has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) && "
    f"has(object.spec.affinity.nodeAffinity.{_REQUIRED}) && "
    f"has(object.spec.affinity.nodeAffinity.{_REQUIRED}.nodeSelectorTerms) ? "
    f"dyn(object.spec.affinity.nodeAffinity.{_REQUIRED}.nodeSelectorTerms) : dyn([])"
)


def _plain(requirements: str) -> str:
    """The pod's own node selector requirements as plain maps: 1.37 cannot put its typed objects
    and the maps CEL builds into one JSON patch value."""
    return (
        f"{requirements}.map(e, has(e.values) ? "
        "dyn({'key': dyn(e.key), 'operator': dyn(e.operator), 'values': dyn(e.values.map(v, string(v)))}) : "
        "dyn({'key': dyn(e.key), 'operator': dyn(e.operator)}))"
    )


def _term(group: str | None) -> str:
    """An own term `t` ANDed with the affinity expression `group` (None: none) and every exclusion."""
    ours = "dyn(variables.excluded)" if group is None else f"dyn([{group}]) + dyn(variables.excluded)"
    expressions = f"dyn(has(t.matchExpressions) ? {_plain('t.matchExpressions')} : []) + {ours}"
    fields = _plain("t.matchFields")
    return (
        f"has(t.matchFields) ? dyn({{'matchExpressions': {expressions}, 'matchFields': dyn({fields})}}) "
        f": dyn({{'matchExpressions': {expressions}}})"
    )


# Term-major like the webhook (`scheduling._combined_terms`): each own term once per affinity key.
_COMBINED_TERMS = (
    f"variables.affinity.size() == 0 ? variables.own.map(t, {_term(None)}) : "
    f"variables.own.map(t, variables.affinity.map(g, {_term('g')})).flatten()"
)


_FRESH_TERMS = (
    "variables.affinity.size() == 0 ? [dyn({'matchExpressions': variables.excluded})] : "
    "variables.affinity.map(g, dyn({'matchExpressions': dyn([g]) + dyn(variables.excluded)}))"
)

# The webhook's bound on a pod's required terms (`scheduling._inject_node_affinity`), in its words.
_TERMS_REFUSAL = """
variables.affinity.size() == 0 && variables.excluded.size() == 0 ? '' :
variables.own.size() > int(params.data.maxTerms) ?
  'the pod\\'s required node affinity has ' + string(variables.own.size()) + ' terms, more than the limit of ' +
  params.data.maxTerms + ': simplify the pod\\'s nodeAffinity' :
variables.termCount > int(params.data.maxTerms) ?
  'the pod\\'s required node affinity has ' + string(variables.own.size()) + ' terms; combined with ' +
  string(variables.affinity.size() == 0 ? 1 : variables.affinity.size()) + ' affinity label keys it would need ' +
  string(variables.termCount) + ' terms, more than the limit of ' + params.data.maxTerms +
  ': simplify the pod\\'s nodeAffinity or choose fewer affinity labels' : ''
""".strip()
_TERM_COUNT = (
    "variables.own.size() == 0 ? (variables.affinity.size() == 0 ? 1 : variables.affinity.size()) : "
    "variables.own.size() * (variables.affinity.size() == 0 ? 1 : variables.affinity.size())"
)
# S1/S3: a pod that names no class, or only the cluster's globalDefault one that the Priority
# plugin wrote in (unless the workload asked for it with the annotation), gets the default class
# with its value and preemption policy: the Priority plugin ran before any policy.
_NAMED_NOTHING = (
    "!has(object.spec.priorityClassName) || object.spec.priorityClassName == '' || "
    "(object.spec.priorityClassName == params.data.globalDefaultClass && !("
    f"{_has_annotation(PRIORITY_CLASS_ANNOTATION)} && "
    f"object.metadata.annotations['{PRIORITY_CLASS_ANNOTATION}'] == object.spec.priorityClassName))"
)

# The webhook's message for a class outside the subset (`choices.not_allowed`), word for word.
_CLASS_MESSAGE = (
    "'priority class ' + object.spec.priorityClassName + ' not available in project ' + "
    "namespaceObject.metadata.name + '; allowed: ' + "
    "(variables.allowed.size() == 0 ? 'none' : variables.allowed.join(', '))"
)


_CLASS_REFUSAL = (
    f"params.data.enforcePriorityClasses != 'true' || {_NAMED_NOTHING} || "
    f"object.spec.priorityClassName in variables.allowed ? '' : {_CLASS_MESSAGE}"
)
# The webhook's refusals joined as it joins them (`scheduling.mutate_target`): affinity, then class.
_REFUSAL = (
    "variables.termsRefusal != '' && variables.classRefusal != '' ? "
    "variables.termsRefusal + '; ' + variables.classRefusal : variables.termsRefusal + variables.classRefusal"
)

# A policy cannot refuse, so the mutating policy writes its refusal into an annotation that the
# validating policy refuses with; the pod is never stored with it. Every refusal is decided in the
# mutating policy, in the one evaluation that also writes the defaults, from one reading of the
# parameters: the two policies each read them from the apiserver's informer at their own moment,
# so a validation that read them again could judge a default written from the parameters of before
# by those of after (a settings change that takes the default class out of the subset would then
# refuse a pod that chose nothing). The validating policy therefore reads no parameters.
REFUSAL_ANNOTATION = "scheduling.hopsworks.ai/policy-refusal"
_ESCAPED_REFUSAL = REFUSAL_ANNOTATION.replace("/", "~1")
_REFUSAL_PATCH = f"""
variables.refusal == '' ? [] :
!has(object.metadata.annotations) ? [JSONPatch{{op: 'add', path: '/metadata/annotations',
  value: {{'{REFUSAL_ANNOTATION}': variables.refusal}}}}] :
[JSONPatch{{op: 'add', path: '/metadata/annotations/{_ESCAPED_REFUSAL}', value: variables.refusal}}]
""".strip()

_AFFINITY_PATCH = f"""
variables.refusal != '' || (variables.affinity.size() == 0 && variables.excluded.size() == 0) ? [] :
!has(object.spec.affinity) ? [JSONPatch{{op: 'add', path: '/spec/affinity',
  value: {{'nodeAffinity': {{'{_REQUIRED}': {{'nodeSelectorTerms': variables.fresh}}}}}}}}] :
!has(object.spec.affinity.nodeAffinity) ? [JSONPatch{{op: 'add', path: '/spec/affinity/nodeAffinity',
  value: {{'{_REQUIRED}': {{'nodeSelectorTerms': variables.fresh}}}}}}] :
!has(object.spec.affinity.nodeAffinity.{_REQUIRED}) ? [JSONPatch{{op: 'add',
  path: '/spec/affinity/nodeAffinity/{_REQUIRED}', value: {{'nodeSelectorTerms': variables.fresh}}}}] :
[JSONPatch{{op: 'add', path: '/spec/affinity/nodeAffinity/{_REQUIRED}/nodeSelectorTerms', value: variables.combined}}]
""".strip()

_PRIORITY_PATCH = f"""
params.data.priorityClassName == '' || !({_NAMED_NOTHING}) ? [] : [
  JSONPatch{{op: 'add', path: '/spec/priorityClassName', value: params.data.priorityClassName}},
  JSONPatch{{op: 'add', path: '/spec/priority', value: int(params.data.priority)}},
  JSONPatch{{op: 'add', path: '/spec/preemptionPolicy', value: params.data.preemptionPolicy}}]
""".strip()

_QUEUE_PATCH = f"""
params.data.runaiQueue == '' ? [] :
!has(object.metadata.labels) ? [JSONPatch{{op: 'add', path: '/metadata/labels',
  value: {{'{RUNAI_QUEUE_LABEL}': params.data.runaiQueue}}}}] :
[JSONPatch{{op: 'add', path: '/metadata/labels/{RUNAI_QUEUE_LABEL.replace("/", "~1")}', value: params.data.runaiQueue}}]
""".strip()


_PATCH = "!variables.compiled ? [] :\n" + " +\n".join(
    f"({part})" for part in (_REFUSAL_PATCH, _AFFINITY_PATCH, _PRIORITY_PATCH, _QUEUE_PATCH)
)


def _match_constraints() -> dict[str, Any]:
    return {
        "namespaceSelector": {"matchExpressions": [{"key": PROJECT_LABEL, "operator": "Exists"}]},
        "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
    }


# The value of ADMISSION_POLICIES_LABEL on a namespace whose parameters the leader has written.
POLICIES_ON = "on"


def _binding_match() -> dict[str, Any]:
    """Project namespaces the leader has labelled after writing their parameters: a new project's
    pods are left to the webhook until then, never refused for want of parameters. A labelled
    namespace whose parameters are missing is refused (parameterNotFoundAction Deny)."""
    return {
        "namespaceSelector": {
            "matchExpressions": [
                {"key": PROJECT_LABEL, "operator": "Exists"},
                {"key": ADMISSION_POLICIES_LABEL, "operator": "In", "values": [POLICIES_ON]},
            ]
        },
        "resourceRules": _match_constraints()["resourceRules"],
    }


def _binding(kind: str, api_version: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{api_version}",
        "kind": f"{kind}Binding",
        "metadata": {"name": POLICY_NAME},
        "spec": {
            "policyName": POLICY_NAME,
            # No namespace: the ConfigMap of the pod's own namespace. Missing parameters deny. The
            # validating policy reads none (see REFUSAL_ANNOTATION).
            **(
                {"validationActions": ["Deny"]}
                if kind == "ValidatingAdmissionPolicy"
                else {"paramRef": {"name": PARAMS_NAME, "parameterNotFoundAction": "Deny"}}
            ),
            "matchResources": _binding_match(),
        },
    }


def policy_objects(mutating_api_version: str, validating_api_version: str = "v1") -> list[dict[str, Any]]:
    """The policies and their bindings, in the API versions the apiserver serves (discovery)."""
    param_kind = {"apiVersion": "v1", "kind": "ConfigMap"}
    mutating = {
        "apiVersion": f"{GROUP}/{mutating_api_version}",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME},
        "spec": {
            "paramKind": param_kind,
            "matchConstraints": _match_constraints(),
            "matchConditions": MATCH_CONDITIONS,
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "variables": [
                {"name": "compiled", "expression": "params.data.compiled == 'true'"},
                {"name": "affinity", "expression": _GROUPS.format(field="affinityIn", operator="In")},
                {"name": "excluded", "expression": _GROUPS.format(field="antiAffinityNotIn", operator="NotIn")},
                {"name": "own", "expression": _OWN_TERMS},
                {"name": "fresh", "expression": _FRESH_TERMS},
                {"name": "combined", "expression": _COMBINED_TERMS},
                {"name": "termCount", "expression": _TERM_COUNT},
                {
                    "name": "allowed",
                    "expression": "params.data.allowedPriorityClasses == '' ? [] : "
                    "params.data.allowedPriorityClasses.split(',')",
                },
                {"name": "termsRefusal", "expression": _TERMS_REFUSAL},
                {"name": "classRefusal", "expression": _CLASS_REFUSAL},
                {"name": "refusal", "expression": _REFUSAL},
            ],
            # One mutation whose patch holds every part: each mutation is evaluated and applied on
            # its own, and the parts touch different fields, all decided from the pod as it came.
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": _PATCH}}],
        },
    }
    validating = {
        "apiVersion": f"{GROUP}/{validating_api_version}",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY_NAME},
        "spec": {
            "matchConstraints": _match_constraints(),
            "matchConditions": MATCH_CONDITIONS,
            "failurePolicy": "Fail",
            "validations": [
                {
                    "expression": f"!{_has_annotation(REFUSAL_ANNOTATION)}",
                    "messageExpression": f"string(object.metadata.annotations['{REFUSAL_ANNOTATION}'])",
                    "reason": "Forbidden",
                },
            ],
        },
    }
    return [
        mutating,
        _binding("MutatingAdmissionPolicy", mutating_api_version),
        validating,
        _binding("ValidatingAdmissionPolicy", validating_api_version),
    ]


def decided_by_policies(record: NamespaceInfo, snapshot: ClusterSnapshot) -> bool:
    """Whether the policies decide every plain pod of this namespace by themselves: the leader then
    labels it for the bindings (ADMISSION_POLICIES_LABEL), which is what the webhooks' selectors
    can read. Not with Run:ai on (the `kai.scheduler/preemptibility` label, the binding on a first
    pod and R2's checks are the webhook's), nor with Kueue on (S4's queue label), nor with the
    priority class subset in warn mode (the warning and its count are the webhook's), nor where
    the project's annotations cannot be read (the webhook warns on every pod that they are
    ignored)."""
    settings = snapshot.settings
    if not record.is_project or settings.run_ai_enable or settings.kueue_installed or warns(settings, PRIORITY_CLASS):
        return False
    return not namespace_plan(record, snapshot).offer.notes


def served_mutating_version(served: Mapping[str, list[str]]) -> str | None:
    """The MutatingAdmissionPolicy version to write, from discovery ({groupVersion: [kinds]}):
    v1 where served, else the beta; None where the apiserver serves neither (policies off)."""
    for version in ("v1", "v1beta1"):
        if "MutatingAdmissionPolicy" in served.get(f"{GROUP}/{version}", ()):
            return version
    return None


def desired_params(snapshot: ClusterSnapshot) -> list[dict[str, Any]]:
    """The parameter ConfigMaps the leader is to keep written (server-side apply): one per project
    namespace whose pods the policies may take. The policies and bindings are the chart's
    (manifests/chart/templates/14-admission-policies.yaml, generated from `policy_objects`).

    With Run:ai on, a namespace not bound yet gets parameters that leave its pods to the webhook
    (`compiled` false): the webhook binds it on its first pod (R2). Without parameters the
    bindings would deny that pod before any webhook is called, and the namespace would wait for
    the leader's next reconcile pass."""
    settings = snapshot.settings
    global_default = next((c for c in snapshot.priority_classes.values() if c.global_default), None)
    objects: list[dict[str, Any]] = []
    for name in sorted(snapshot.namespaces):
        record = snapshot.namespaces[name]
        if PROJECT_LABEL not in record.labels:
            continue
        params = policy_params(namespace_plan(record, snapshot), global_default)
        if settings.run_ai_enable and record.runai_queue is None:
            params["compiled"] = "false"
        objects.append(params_config_map(name, params))
    return objects


def desired_objects(snapshot: ClusterSnapshot, mutating_api_version: str | None) -> list[dict[str, Any]]:
    """Everything a cluster with the policies on holds, in apply order: the policies and bindings
    the chart installs, then the parameters the leader writes. None for the version (the
    apiserver serves no MutatingAdmissionPolicy): nothing, the webhook decides every pod."""
    if mutating_api_version is None:
        return []
    return policy_objects(mutating_api_version) + desired_params(snapshot)
