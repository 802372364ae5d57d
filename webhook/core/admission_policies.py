"""Rules S1-S3 and S5's labels compiled for the apiserver: MutatingAdmissionPolicy and
ValidatingAdmissionPolicy objects, with their bindings, and one parameter ConfigMap per project.

The policies are the same for every project; what differs between projects is in the parameters,
and the parameters are computed here from the Python decision's own inputs (`core.namespace_plan`:
the offer, the default priority class with its value), so the CEL only applies what Python
decided. The policies cover every pod of a project namespace but a static one, the workload's own
choice of node labels (the affinity annotations) included: the annotation is read, checked against
the project's list and refused in the webhook's words, all in CEL.

Parameter values are strings (a ConfigMap's data). Lists of node labels are written grouped by
key as `key=v1|v2;key2=v3`: `;`, `|` and `=` cannot appear in a label key or value, so CEL's
`split` reads them back without ambiguity.

With Run:ai on, the labels S5 writes depend on the pod's workload kind: the parameters hold the
settings' kind rules and, per kind, the labels `core.preemptibility.runai_labels` gives it; the
policy works out the kind as `core.kinds.pod_kind` does and writes that kind's labels with the
project's queue, read from the namespace as the apiserver has it (the label Run:ai's own webhooks
are selected by).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from webhook.core.enforcement import AFFINITY, PRIORITY_CLASS, warns
from webhook.core.kinds import LABELLED_KINDS, WORKLOAD_TYPE_LABEL
from webhook.core.namespace_plan import Grouped, NamespacePlan, namespace_plan
from webhook.core.preemptibility import runai_labels
from webhook.core.scheduling import MAX_CHOICE_CHARS
from webhook.settings import PREEMPTIBLE_KINDS, UNKNOWN_KIND, WORKLOAD_KINDS, ClusterSettings, WorkloadKindRules
from webhook.snapshot import (
    ADMISSION_POLICIES_LABEL,
    AFFINITY_ANNOTATION,
    ANTI_AFFINITY_ANNOTATION,
    MIRROR_POD_ANNOTATION,
    PRIORITY_CLASS_ANNOTATION,
    PROJECT_LABEL,
    RUNAI_MOVE_ANNOTATION,
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


# What the encodings below separate with; none can appear in a label key or value, an API group or
# a kind. A setting holding one can never match a pod the apiserver would store, so it is left out.
_SEPARATORS = frozenset(";|=")


def _separator_free(*texts: str) -> bool:
    return not any(c in _SEPARATORS for text in texts for c in text)


def encode_kind_rules(rules: WorkloadKindRules) -> str:
    """The label rules that may give a pod its kind, in order (never a job's: `kinds.classify_workload`),
    as `label|kind` or `label=value|kind`."""
    encoded = []
    for rule in rules.rules:
        if rule.kind in PREEMPTIBLE_KINDS or not _separator_free(rule.label, rule.value or ""):
            continue
        selector = rule.label if rule.value is None else f"{rule.label}={rule.value}"
        encoded.append(f"{selector}|{rule.kind}")
    return ";".join(encoded)


def _kind_label_pairs(kind: str, settings: ClusterSettings) -> list[tuple[str, str]]:
    return list(runai_labels(None if kind == UNKNOWN_KIND else kind, settings).items())


def affinity_compilable(plan: NamespacePlan) -> bool:
    """Whether the node labels a workload may choose can be listed in the parameters."""
    return not any("," in label for label in (*plan.offer.affinity, *plan.offer.anti_affinity))


def runai_labels_compilable(settings: ClusterSettings) -> bool:
    """Whether every kind's Run:ai labels can be written as parameters (a label the settings name
    with a separator in it is the apiserver's to refuse, through the webhook)."""
    return all(
        _separator_free(k, v) for kind in (*WORKLOAD_KINDS, UNKNOWN_KIND) for k, v in _kind_label_pairs(kind, settings)
    )


def runai_params(settings: ClusterSettings) -> dict[str, str]:
    """What the policy needs to label a pod as S5 does: whether Run:ai is on, how a pod's kind is
    read (`kinds.pod_kind`), and each kind's labels (`preemptibility.runai_labels`) as
    `key=value;key2=value2`. `systemJobTypes` is absent when the settings name none, so that an
    empty type stays distinguishable from no type."""
    rules = settings.scheduler.workload_kinds
    data = {
        "runaiEnabled": "true" if settings.run_ai_enable else "false",
        "kindRules": encode_kind_rules(rules),
        "jobOwners": ";".join(
            f"{o.api_group}|{o.kind}" for o in rules.job_owners if _separator_free(o.api_group, o.kind)
        ),
    }
    job_types = [t for t in rules.system_job_types if _separator_free(t)]
    if job_types:
        data["systemJobTypes"] = "|".join(job_types)
    for kind in (*WORKLOAD_KINDS, UNKNOWN_KIND):
        data[f"runaiLabels.{kind}"] = ";".join(f"{k}={v}" for k, v in _kind_label_pairs(kind, settings))
    return data


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
        # The labels a workload may choose (a chosen list is split at commas, so none holds one:
        # `affinity_compilable`).
        "affinityAllowed": ",".join(offer.affinity),
        "antiAffinityAllowed": ",".join(offer.anti_affinity),
        "enforceAffinity": "false" if warns(settings, AFFINITY) else "true",
        "allowedPriorityClasses": ",".join(offer.priority_classes),
        # Warn mode admits a class outside the subset with a warning the webhook words: not compiled.
        "enforcePriorityClasses": "false" if warns(settings, PRIORITY_CLASS) else "true",
        # Read by no policy of this release (the queue comes from the namespace itself); kept for
        # the policy of the release before, which a `helm rollback` puts back beside these parameters.
        "runaiQueue": (plan.namespace.runai_queue or "") if settings.run_ai_enable else "",
        **runai_params(settings),
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


# Pods the policies take: every pod but a static one (the kubelet's; the webhook leaves it too).
MATCH_CONDITIONS = [{"name": "no-mirror-pod", "expression": f"!{_has_annotation(MIRROR_POD_ANNOTATION)}"}]

_GROUPS = """params.data.{field} == '' ? [] : params.data.{field}.split(';').map(g, {{
  'key': dyn(g.split('=')[0]), 'operator': dyn('{operator}'), 'values': dyn(g.split('=')[1].split('|'))}})"""


# A workload's own choice of node labels (`scheduling.parse_label_list`, `choices.resolve_affinity`,
# `namespace_plan.grouped`), for each of the two annotations (`{v}`: the variables' prefix).
def _annotation(key: str) -> str:
    return f"object.metadata.annotations['{key}']"


def _chosen_items(key: str) -> str:
    """The annotation's comma-separated items, trimmed, each once, in order, empties dropped."""
    return (
        f"!{_has_annotation(key)} || {_annotation(key)}.size() > {MAX_CHOICE_CHARS} ? [] : "
        f"{_annotation(key)}.split(',').map(x, x.trim()).distinct().filter(x, x != '')"
    )


_NOT_A_LABEL = "!x.contains('=') || x.split('=')[0].trim() == ''"


def _parse_error(key: str, items: str) -> str:
    """The webhook's words for an annotation it cannot read (`parse_label_list`), else ''."""
    return (
        f"!{_has_annotation(key)} ? '' : {_annotation(key)}.size() > {MAX_CHOICE_CHARS} ? "
        f"'annotation {key}: ' + string({_annotation(key)}.size()) + ' characters, more than the limit of "
        f"{MAX_CHOICE_CHARS}' : {items}.exists(x, {_NOT_A_LABEL}) ? 'annotation {key}: \\'' + "
        f"{items}.filter(x, {_NOT_A_LABEL}).map(x, x.size() > 100 ? x.substring(0, 100) : x)[0] + "
        "'\\' is not a key=value node label' : ''"
    )


def _subset_error(what: str, items: str, allowed: str) -> str:
    """`choices.not_allowed` for the chosen labels outside the project's list, in enforce mode."""
    return (
        f"params.data.enforceAffinity != 'true' || {items}.all(x, x in {allowed}) ? '' : "
        f"'{what} ' + {items}.filter(x, !(x in {allowed})).join(', ') + ' not available in project ' + "
        f"namespaceObject.metadata.name + '; allowed: ' + ({allowed}.size() == 0 ? 'none' : {allowed}.join(', '))"
    )


def _chosen_groups(items: str, operator: str) -> str:
    """The chosen labels grouped by key in first-seen order, each group's values once."""
    key = "x.split('=')[0].trim()"
    return (
        f"{items}.map(x, {key}).distinct().map(k, {{'key': dyn(k), 'operator': dyn('{operator}'), "
        f"'values': dyn({items}.filter(x, {key} == k).map(x, x.substring(x.indexOf('=') + 1).trim()).distinct())}})"
    )


def _allowed(field: str) -> str:
    return f"(params.data.{field} == '' ? [] : params.data.{field}.split(','))"


def _error_of(key: str, what: str, parse_error: str, items: str, allowed_field: str) -> str:
    """An annotation's refusal: unreadable (every mode), else labels outside the project's list."""
    return (
        f"{parse_error} != '' ? {parse_error} : !{_has_annotation(key)} ? '' : "
        f"{_subset_error(what, items, _allowed(allowed_field))}"
    )


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


def _present(expression: str) -> str:
    """Whether the own term `t` already has `expression` (`scheduling._expression_key`: the same
    key, operator and values in any order)."""
    return (
        f"(has(t.matchExpressions) && t.matchExpressions.exists(e, e.key == {expression}.key && "
        f"e.operator == {expression}.operator && has(e.values) && e.values.sort() == {expression}.values.sort()))"
    )


def _term(ours: str) -> str:
    """The own term `t` ANDed with those of the expressions `ours` it does not have yet."""
    added = f"({ours}).filter(x, !{_present('x')})"
    expressions = f"dyn(has(t.matchExpressions) ? {_plain('t.matchExpressions')} : []) + dyn({added})"
    fields = _plain("t.matchFields")
    return (
        f"has(t.matchFields) ? dyn({{'matchExpressions': {expressions}, 'matchFields': dyn({fields})}}) "
        f": dyn({{'matchExpressions': {expressions}}})"
    )


# An own term that already has every exclusion and one of the affinity expressions is kept as it
# is (`scheduling._combined_terms`): a second mutation changes nothing.
_SATISFIED = (
    f"variables.excluded.all(x, {_present('x')}) && "
    f"(variables.affinity.size() == 0 || variables.affinity.exists(x, {_present('x')}))"
)

# Term-major like the webhook (`scheduling._combined_terms`): each own term once per affinity key.
_COMBINED_TERMS = (
    f"variables.own.map(t, {_SATISFIED} ? [{_term('dyn([])')}] : variables.affinity.size() == 0 ? "
    f"[{_term('dyn(variables.excluded)')}] : "
    f"variables.affinity.map(g, {_term('dyn([g]) + dyn(variables.excluded)')})).flatten()"
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
_TERM_COUNT = "variables.own.size() == 0 ? variables.fresh.size() : variables.combined.size()"
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
# The webhook's refusals in its order: a project Run:ai cannot take yet before any rule
# (`scheduling.mutate_target`), then the rules' joined, then a move (the validating phase).
_NOT_COMPILED = (
    f"'the settings name a Run:ai label the admission policy cannot write ({PARAMS_NAME} in ' + "
    "namespaceObject.metadata.name + ' says compiled: false); its pods wait for the settings to be corrected'"
)
_REFUSAL = (
    f"!variables.compiled ? {_NOT_COMPILED} : "
    "variables.runaiHeld != '' ? variables.runaiHeld : "
    "variables.ruleErrors.size() > 0 ? variables.ruleErrors.join('; ') : variables.moving"
)
# The rules' errors in the webhook's order: each annotation's (`_node_labels`), else the bound on the
# terms, then the class.
_RULE_ERRORS = (
    "[variables.affinityError, variables.antiAffinityError].filter(e, e != '').size() > 0 ? "
    "[variables.affinityError, variables.antiAffinityError, variables.classRefusal].filter(e, e != '') : "
    "[variables.termsRefusal, variables.classRefusal].filter(e, e != '')"
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

# -- S5 with Run:ai on ---------------------------------------------------------------------------
_LABELS = "object.metadata.labels"
_HAS_LABELS = f"has({_LABELS})"


def _label_is(key: str, value: str) -> str:
    return f"('{key}' in {_LABELS} && {_LABELS}['{key}'] == '{value}')"


# `kinds._labelled_kind`: the workload-type label naming a kind a label may give, else the first rule
# (`label|kind` or `label=value|kind`) the pod's labels match.
_KIND_RULE_MATCHES = f"""
!{_HAS_LABELS} || params.data.kindRules == '' ? [] :
params.data.kindRules.split(';').filter(r, r.split('|')[0].contains('=') ?
  (r.split('=')[0] in {_LABELS} && {_LABELS}[r.split('=')[0]] == r.split('|')[0].split('=')[1]) :
  r.split('|')[0] in {_LABELS}).map(r, r.split('|')[1])
""".strip()
_LABELLED_KIND = (
    f"{_HAS_LABELS} && '{WORKLOAD_TYPE_LABEL}' in {_LABELS} && "
    f"{_LABELS}['{WORKLOAD_TYPE_LABEL}'] in {sorted(LABELLED_KINDS)} ? {_LABELS}['{WORKLOAD_TYPE_LABEL}'] : "
    "variables.kindRuleMatches.size() > 0 ? variables.kindRuleMatches[0] : ''"
)
# `kinds.pod_controller` and `is_job_owner`: the first ownerReference, when it is the controller
# (and has a uid), of a kind the settings make jobs of; the group is the apiVersion before its last '/'.
FIRST_OWNER = "object.metadata.ownerReferences[0]"
_CONTROLLED_BY_A_JOB_OWNER = f"""
has(object.metadata.ownerReferences) && object.metadata.ownerReferences.size() > 0 &&
has({FIRST_OWNER}.controller) && {FIRST_OWNER}.controller == true &&
has({FIRST_OWNER}.uid) && {FIRST_OWNER}.uid != '' && params.data.jobOwners != '' &&
has({FIRST_OWNER}.apiVersion) && has({FIRST_OWNER}.kind) &&
(({FIRST_OWNER}.apiVersion.contains('/') ?
  {FIRST_OWNER}.apiVersion.substring(0, {FIRST_OWNER}.apiVersion.lastIndexOf('/')) : '') +
  '|' + {FIRST_OWNER}.kind) in params.data.jobOwners.split(';')
""".strip()
# `kinds._owned_kind`: a job owner's pod is a system job by the workload-type label or a system job type.
_SYSTEM_JOB = (
    f"{_HAS_LABELS} && ({_label_is(WORKLOAD_TYPE_LABEL, 'system-job')} || "
    f"('systemJobTypes' in params.data && 'job-type' in {_LABELS} && "
    f"{_LABELS}['job-type'] in params.data.systemJobTypes.split('|')))"
)
_KIND = (
    "variables.labelledKind != '' ? variables.labelledKind : "
    f"variables.controlledByAJobOwner ? ({_SYSTEM_JOB} ? 'system-job' : 'job') : '{UNKNOWN_KIND}'"
)
# The labels S5 writes (`scheduling._runai_queue`): the project's queue, then the kind's labels.
_RUNAI_LABELS = f"""
!variables.runai || variables.queue == '' ? [] :
[['{RUNAI_QUEUE_LABEL}', variables.queue]] +
(params.data['runaiLabels.' + variables.kind] == '' ? [] :
  params.data['runaiLabels.' + variables.kind].split(';').map(p, [p.split('=')[0], p.split('=')[1]]))
""".strip()
_QUEUE = (
    f"has(namespaceObject.metadata.labels) && '{RUNAI_QUEUE_LABEL}' in namespaceObject.metadata.labels ? "
    f"namespaceObject.metadata.labels['{RUNAI_QUEUE_LABEL}'] : ''"
)
# The webhook's words for a namespace not bound (`runai_admission.project_not_bound`) and one
# moving to another department (`quota.validate_pod`).
_RUNAI_HELD = (
    "!variables.runai ? '' : variables.queue == '' ? 'project namespace ' + namespaceObject.metadata.name + "
    "' is not bound to a Run:ai project yet; its workloads start once it is' : ''"
)
_MOVING = (
    f"variables.runai && has(namespaceObject.metadata.annotations) && "
    f"'{RUNAI_MOVE_ANNOTATION}' in namespaceObject.metadata.annotations ? 'project ' + "
    "namespaceObject.metadata.name + ' is moving to another department; its workloads start once the move is done' : ''"
)

# A pod without labels gets the map with its queue first; each label is then added (replaced) in turn.
_LABEL_PATCH = f"""
variables.runaiLabels.size() == 0 ? [] :
(!{_HAS_LABELS} ? [JSONPatch{{op: 'add', path: '/metadata/labels',
  value: {{'{RUNAI_QUEUE_LABEL}': variables.queue}}}}] : []) +
variables.runaiLabels.map(p, JSONPatch{{op: 'add',
  path: '/metadata/labels/' + p[0].replace('~', '~0').replace('/', '~1'), value: p[1]}})
""".strip()


_PATCH = " +\n".join(f"({part})" for part in (_REFUSAL_PATCH, _AFFINITY_PATCH, _PRIORITY_PATCH, _LABEL_PATCH))


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


class _Choice(NamedTuple):
    """One of the two node label choices, each read the same way."""

    prefix: str  # of its variables
    annotation: str
    what: str  # the word its refusal starts with (`choices.not_allowed`)
    allowed: str  # the parameter listing the labels the project offers
    groups: str  # the variable of the grouped labels the pod gets
    operator: str
    defaults: str  # the parameter of the labels a pod that chose none gets


_CHOICES = (
    _Choice("affinity", AFFINITY_ANNOTATION, "affinity", "affinityAllowed", "affinity", "In", "affinityIn"),
    _Choice(
        "antiAffinity",
        ANTI_AFFINITY_ANNOTATION,
        "anti-affinity",
        "antiAffinityAllowed",
        "excluded",
        "NotIn",
        "antiAffinityNotIn",
    ),
)


def _variables() -> list[tuple[str, str]]:
    """The mutating policy's variables, (name, CEL), each after those it reads."""
    items = [(f"{c.prefix}Items", _chosen_items(c.annotation)) for c in _CHOICES]
    parse_errors = [
        (f"{c.prefix}ParseError", _parse_error(c.annotation, f"variables.{c.prefix}Items")) for c in _CHOICES
    ]
    errors = [
        (
            f"{c.prefix}Error",
            _error_of(c.annotation, c.what, f"variables.{c.prefix}ParseError", f"variables.{c.prefix}Items", c.allowed),
        )
        for c in _CHOICES
    ]
    groups = [
        (
            c.groups,
            f"{_has_annotation(c.annotation)} ? {_chosen_groups(f'variables.{c.prefix}Items', c.operator)} : "
            + _GROUPS.format(field=c.defaults, operator=c.operator),
        )
        for c in _CHOICES
    ]
    allowed = "params.data.allowedPriorityClasses == '' ? [] : params.data.allowedPriorityClasses.split(',')"
    runai = "'runaiEnabled' in params.data && params.data.runaiEnabled == 'true'"
    return [
        ("compiled", "params.data.compiled == 'true'"),
        *items,
        *parse_errors,
        *errors,
        *groups,
        ("own", _OWN_TERMS),
        ("fresh", _FRESH_TERMS),
        ("combined", _COMBINED_TERMS),
        ("termCount", _TERM_COUNT),
        ("allowed", allowed),
        ("runai", runai),
        ("queue", _QUEUE),
        ("kindRuleMatches", _KIND_RULE_MATCHES),
        ("labelledKind", _LABELLED_KIND),
        ("controlledByAJobOwner", _CONTROLLED_BY_A_JOB_OWNER),
        ("kind", _KIND),
        ("runaiLabels", _RUNAI_LABELS),
        ("runaiHeld", _RUNAI_HELD),
        ("moving", _MOVING),
        ("termsRefusal", _TERMS_REFUSAL),
        ("classRefusal", _CLASS_REFUSAL),
        ("ruleErrors", _RULE_ERRORS),
        ("refusal", _REFUSAL),
    ]


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
            "variables": [{"name": name, "expression": expression} for name, expression in _variables()],
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
    can read. Not with Kueue on (S4's queue label), nor with the priority class or affinity subset
    in warn mode (the warning and its count are the webhook's), nor where the project's annotations cannot be
    read (the webhook warns on every pod that they are ignored). With Run:ai on, only a project
    already bound and not moving to another department (the webhook binds on a first pod, R2,
    and its validating phase holds a moving project's pods with a 409) whose labels the
    parameters can carry."""
    settings = snapshot.settings
    if (
        not record.is_project
        or settings.kueue_installed
        or warns(settings, PRIORITY_CLASS)
        or warns(settings, AFFINITY)
    ):
        return False
    if settings.run_ai_enable and (
        record.runai_queue is None or record.moving or not runai_labels_compilable(settings)
    ):
        return False
    plan = namespace_plan(record, snapshot)
    return not plan.offer.notes and affinity_compilable(plan)


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

    The leader labels only the namespaces `decided_by_policies` takes, after their parameters are
    written, and takes the label off first when that ends; the parameters of a namespace the
    policies no longer decide (a project not bound to Run:ai yet, one moving) still say what they
    would do, since the apiserver's namespace and ConfigMap informers may show the two changes in
    either order. With Run:ai on the policy reads the binding from the namespace itself and refuses
    an unbound project's pod in the webhook's words. `compiled` is false only where the settings
    name a Run:ai label the parameters cannot carry: the policy then refuses every pod it sees.
    """
    settings = snapshot.settings
    global_default = next((c for c in snapshot.priority_classes.values() if c.global_default), None)
    objects: list[dict[str, Any]] = []
    for name in sorted(snapshot.namespaces):
        record = snapshot.namespaces[name]
        if PROJECT_LABEL not in record.labels:
            continue
        params = policy_params(namespace_plan(record, snapshot), global_default)
        if settings.run_ai_enable and not runai_labels_compilable(settings):
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
