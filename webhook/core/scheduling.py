"""Rules S1–S6: the scheduling a pod in a project namespace gets, as a pure decision.

`mutate_pod(request, snapshot, now)` reads the AdmissionReview request (a dict), the cluster snapshot
and the settings in it, and returns a Decision with the minimal JSON patch. It never calls out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from webhook.core.choices import not_allowed, resolve_affinity, resolve_priority_class
from webhook.core.decision import Decision, Reason
from webhook.core.enforcement import (
    AFFINITY,
    PRIORITY_CLASS,
    QUEUE_TOPOLOGY,
    WOULD_REFUSE_ANNOTATION,
    WouldRefuse,
    warns,
    with_would_refuse,
)
from webhook.core.kinds import pod_kind
from webhook.core.namespace_plan import (
    Grouped,
    NamespacePlan,
    affinity_audit,
    fresh_terms,
    grouped,
    kueue_resolution,
    match_expressions,
    namespace_plan,
)
from webhook.core.offer import SchedulingOffer
from webhook.core.patch import PodPatch
from webhook.core.pod_groups import deployment_pod_group
from webhook.core.preemptibility import RUNAI_PRIORITY_LABEL, runai_labels
from webhook.core.runai_admission import project_not_bound, runai_pod_refusal
from webhook.snapshot import (
    AFFINITY_ANNOTATION,
    ANTI_AFFINITY_ANNOTATION,
    KUEUE_POD_GROUP_COUNT_ANNOTATION,
    KUEUE_POD_GROUP_LABEL,
    KUEUE_POD_GROUP_SERVING_ANNOTATION,
    KUEUE_QUEUE_LABEL,
    KUEUE_TOPOLOGY_ANNOTATION,
    MIRROR_POD_ANNOTATION,
    PRIORITY_CLASS_ANNOTATION,
    PROJECT_LABEL,
    RUNAI_QUEUE_LABEL,
    TOPOLOGY_ANNOTATION,
    ClusterSnapshot,
    NamespaceInfo,
)

# Required node affinity is a handful of expressions; the cap bounds the patch a hostile pod could
# make us build (its terms are copied once per affinity key).
MAX_RESULT_EXPRESSIONS = 10_000
# S5 refuses with Reason.RUNAI_PROJECT_NOT_BOUND (no Run:ai binding yet: the shell binds, then
# refuses) or Reason.RUNAI_BINDING_SETTLING (bound moments ago: the apiserver may not select Run:ai's
# webhook yet).
# How long a binding must have been in this replica's watch-fed cache before its pods are admitted.
# The apiserver evaluates Run:ai's namespaceSelector against its own informer cache, fed by the
# same watch as ours but without the network hop, so it normally has the label first; the margin
# covers a second apiserver whose cache trails (milliseconds in practice; a second is ample).
BINDING_SETTLE_S = 1.0

REQUIRED_AFFINITY_PATH = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"


# Immutable like a frozen dataclass, but made for every review: a NamedTuple is built in a fifth
# of the time (a frozen dataclass sets each field through object.__setattr__).
class PodTarget(NamedTuple):
    """A pod CREATE in a project namespace: the only requests the scheduling rules touch.

    The maps the rules read are looked up once here and shared: looked up again in each rule, they
    cost a tenth of a mutation."""

    pod: Mapping[str, Any]
    namespace: NamespaceInfo
    kind: str | None
    labels: Mapping[str, Any]
    annotations: Mapping[str, Any]
    spec: Mapping[str, Any]


# PodTarget(...) runs the NamedTuple's Python __new__; the tuple's own is a third of that.
_new_target = tuple.__new__


def _map(value: Any) -> Mapping[str, Any]:
    # JSON objects decode to dict; the exact check is several times cheaper than the Mapping ABC's.
    return value if isinstance(value, dict) else {}


def request_namespace(request: Mapping[str, Any]) -> str:
    obj = request.get("object") or request.get("oldObject") or {}
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    namespace = request.get("namespace") or (meta.get("namespace") if isinstance(meta, dict) else None)
    return namespace if isinstance(namespace, str) else ""  # the object is not schema-checked yet


def _created_pod(request: Mapping[str, Any]) -> dict[str, Any] | None:
    """The pod a pod CREATE request makes; None for any other request."""
    if request.get("operation") != "CREATE" or request.get("subResource"):
        return None
    kind = request.get("kind") or {}
    if kind.get("kind") != "Pod" or kind.get("group", "") != "":
        return None
    pod = request.get("object")
    return pod if isinstance(pod, dict) else None


def unseen_namespace(request: Mapping[str, Any], snapshot: ClusterSnapshot) -> str | None:
    """The namespace of a pod CREATE that the snapshot has no record of, else None.

    The apiserver sends pods here only from namespaces matching the webhooks' selector, so such a
    namespace is a project namespace this replica's watch has not delivered yet: its pod must not
    pass unchanged as if it were no project's (the shell reads the namespace, or refuses)."""
    if _created_pod(request) is None:
        return None
    name = request_namespace(request)
    return name if name and name not in snapshot.namespaces else None


def pod_target(request: Mapping[str, Any], snapshot: ClusterSnapshot) -> PodTarget | None:
    """The pod this system owns in this request, or None when it must pass unchanged (S6)."""
    pod = _created_pod(request)
    if pod is None:
        return None
    name = request.get("namespace")
    if type(name) is not str or not name:  # the apiserver always sends it; a hand-made review may not
        name = request_namespace(request)
    namespace = snapshot.namespaces.get(name)
    if namespace is None or PROJECT_LABEL not in namespace.labels:  # NamespaceInfo.is_project
        return None
    # Every review reads these: the dict checks are written out (a call to _map each was a fifth of this).
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        meta = {}
    annotations = meta.get("annotations")
    if not isinstance(annotations, dict):
        annotations = {}
    elif MIRROR_POD_ANNOTATION in annotations:
        return None  # static pods: the kubelet owns them, and the apiserver refuses changes anyway
    labels = meta.get("labels")
    if not isinstance(labels, dict):
        labels = {}
    spec = pod.get("spec")
    kind = pod_kind(labels, meta, snapshot.settings.scheduler.workload_kinds)
    return _new_target(PodTarget, (pod, namespace, kind, labels, annotations, spec if isinstance(spec, dict) else {}))


# A choice of node labels is a few hundred characters; the bound keeps a hostile annotation (the
# apiserver allows 256 KiB) from costing parse time, memory and audit log space.
MAX_CHOICE_CHARS = 4096


def parse_label_list(raw: Any) -> list[str]:
    """`a=b, c=d` -> ["a=b", "c=d"], duplicates dropped. Raises ValueError naming the bad entry."""
    if not isinstance(raw, str):
        raise ValueError(f"must be a string, got {type(raw).__name__}")
    if len(raw) > MAX_CHOICE_CHARS:
        raise ValueError(f"{len(raw)} characters, more than the limit of {MAX_CHOICE_CHARS}")
    items = list(dict.fromkeys(item.strip() for item in raw.split(",")))
    items = [item for item in items if item]
    for item in items:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():
            # Quoted as written, not by repr: the compiled policy words it the same (admission_policies).
            raise ValueError(f"'{item[:100]}' is not a key=value node label")
    return items


@dataclass(slots=True)
class _Mutation:
    """One pod's pass through the rules: what they read, and the patch, audit annotations,
    refusals, would-be refusals (`core.enforcement`) and warnings they add up."""

    target: PodTarget
    plan: NamespacePlan  # what the namespace's pods get when they choose nothing
    offer: SchedulingOffer  # the plan's
    snapshot: ClusterSnapshot
    patch: PodPatch
    warnings: list[str]
    audit: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    would_refuse: list[WouldRefuse] = field(default_factory=list)
    # What a refusal answers: a policy refusal, unless a rule says the pod may be created again.
    code: int = 403
    reason: Reason = Reason.FORBIDDEN

    def refuse(self, family: str, message: str) -> bool:
        """A refusal of `family`: kept, or with the family in warn mode a would-be refusal. True
        when the rule carries on as if the choice were allowed."""
        if warns(self.snapshot.settings, family):
            self.would_refuse.append((family, message))
            return True
        self.errors.append(message)
        return False


def mutate_pod(
    request: Mapping[str, Any], snapshot: ClusterSnapshot, now: float | None = None, settle_s: float = BINDING_SETTLE_S
) -> Decision:
    """`now`: the time, to hold pods back while a fresh Run:ai binding settles (None: no wait)."""
    target = pod_target(request, snapshot)
    if target is None:
        return Decision.allow()
    return mutate_target(target, snapshot, now, settle_s)[0]


def mutate_target(
    target: PodTarget, snapshot: ClusterSnapshot, now: float | None = None, settle_s: float = BINDING_SETTLE_S
) -> tuple[Decision, PodPatch | None]:
    """The rules over one pod, or a pod template seen as the pod it will become (`core.owners`):
    the decision, and the patch it was built from (None when refused before any rule ran)."""
    settings = snapshot.settings
    if settings.run_ai_enable:
        held = runai_binding_refusal(target.namespace, now, settle_s) or runai_pod_refusal(target.pod)
        if held is not None:
            return held, None
    # The offer is what the scheduling API shows: a choice outside it is refused, its defaults apply.
    plan = namespace_plan(target.namespace, snapshot)
    offer = plan.offer
    m = _Mutation(target, plan, offer, snapshot, PodPatch(target.pod), list(offer.notes))

    _node_affinity(m)
    _priority(m)
    if settings.run_ai_enable:
        _runai_queue(m)
        if settings.kueue_installed:
            m.warnings.append("Kueue and Run:ai are both enabled in settings; only the Run:ai queue was set")
    elif offer.kueue:
        _kueue(m)
    else:
        _kueue_off(m)

    if m.errors:
        refused = Decision.deny("; ".join(m.errors), code=m.code, reason=m.reason, warnings=m.warnings)
        return with_would_refuse(refused, m.would_refuse), m.patch
    if m.would_refuse:
        families = ",".join(dict.fromkeys(family for family, _ in m.would_refuse))
        m.patch.set_annotation(WOULD_REFUSE_ANNOTATION, families)
    # Made directly: the audit map is this mutation's own, so it needs no copy (Decision.allow's).
    decision = Decision(True, "", 200, None, tuple(m.patch.operations()), tuple(m.warnings), m.audit)
    return with_would_refuse(decision, m.would_refuse), m.patch


# -- S1/S2: node labels ------------------------------------------------------------------------
def _node_affinity(m: _Mutation) -> None:
    annotations = m.target.annotations
    if AFFINITY_ANNOTATION in annotations or ANTI_AFFINITY_ANNOTATION in annotations:
        affinity, anti_affinity = _node_labels(m)
        if m.errors or not (affinity or anti_affinity):
            return
        groups, excluded, audit = grouped(affinity), grouped(anti_affinity), affinity_audit(affinity, anti_affinity)
    else:  # the offer's defaults, grouped once per namespace
        plan = m.plan
        groups, excluded, audit = plan.affinity_groups, plan.anti_affinity_groups, plan.affinity_audit
        if not audit:
            return  # no default labels
        if plan.spec_affinity is not None and not isinstance(m.target.spec.get("affinity"), dict):
            # The common case, a pod without affinity: the plan's (`_inject_node_affinity` would
            # make the same), fresh from its serialised form.
            m.patch.add("/spec/affinity", orjson.loads(plan.spec_affinity))
            m.audit.update(audit)
            return
    terms_error = _inject_node_affinity(m.target, groups, excluded, m.plan.max_terms, m.patch)
    if terms_error:
        m.errors.append(terms_error)
        return
    m.audit.update(audit)


def _node_labels(m: _Mutation) -> tuple[list[str], list[str]]:
    """The workload's affinity labels when it chose, else the offer's defaults (the project's,
    else the cluster's). Labels outside the offer are kept when affinity is in warn mode; an
    annotation that cannot be read is refused in every mode."""
    target, offer, errors = m.target, m.offer, m.errors
    chosen: list[list[str]] = []
    for annotation, anti in ((AFFINITY_ANNOTATION, False), (ANTI_AFFINITY_ANNOTATION, True)):
        values: list[str] | None = None
        if annotation in target.annotations:
            try:
                values = parse_label_list(target.annotations[annotation])
            except ValueError as exc:
                errors.append(f"annotation {annotation}: {exc}")
                chosen.append([])
                continue
        resolved = resolve_affinity(offer, values, anti=anti)
        if resolved.error:
            m.refuse(AFFINITY, resolved.error)
        chosen.append(list(resolved.value))
    return chosen[0], chosen[1]


def _expression_key(expression: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """What makes two expressions the same (values in any order); None when it cannot be ours."""
    values = expression.get("values") or ()
    if not isinstance(values, list | tuple) or not all(isinstance(v, str) for v in values):
        return None
    key, operator = expression.get("key"), expression.get("operator")
    if not isinstance(key, str) or not isinstance(operator, str):
        return None
    return (key, operator, tuple(sorted(values)))


def _inject_node_affinity(
    target: PodTarget, affinity: Grouped, anti_affinity: Grouped, limit: int, patch: PodPatch
) -> str | None:
    """AND our constraints into every required term (`affinity`: one `In` expression per key,
    `anti_affinity`: `NotIn` ones); returns an error message or None.

    Terms are ORed by the scheduler. A node must match one of our affinity keys (one term per key)
    and none of the anti-affinity labels (NotIn in every term), so the result is the cross product
    of the pod's own terms and our affinity expressions. A term that already carries our
    expressions is kept as is, which makes reinvocation a no-op.
    """
    node_affinity = _map(_map(target.spec.get("affinity")).get("nodeAffinity"))
    required = _map(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    existing = required.get("nodeSelectorTerms")
    own_terms = [t for t in existing if isinstance(t, dict)] if isinstance(existing, list) else []

    if len(own_terms) > limit:
        # Every own term stays at least one term, so this is refused before any work that grows
        # with the terms (10,000 of them took seconds of event loop when de-duplicated first).
        return (
            f"the pod's required node affinity has {len(own_terms)} terms, more than the limit of {limit}: "
            "simplify the pod's nodeAffinity"
        )

    if not own_terms:
        new_terms = fresh_terms(affinity, anti_affinity)
    else:
        groups: list[dict[str, Any] | None] = list(match_expressions(affinity, "In")) or [None]
        excluded = match_expressions(anti_affinity, "NotIn")
        error = _bounded(own_terms, groups)
        if error is not None:
            return error
        new_terms = _combined_terms(own_terms, groups, excluded)
        if new_terms == own_terms:
            return None
    if len(new_terms) > limit:
        return (
            f"the pod's required node affinity has {len(own_terms)} terms; combined with "
            f"{len(affinity) or 1} affinity label keys it would need {len(new_terms)} terms, more than the limit of "
            f"{limit}: simplify the pod's nodeAffinity or choose fewer affinity labels"
        )
    _place_terms(target, required, new_terms, patch)
    return None


def _bounded(own_terms: list[dict[str, Any]], groups: Sequence[dict[str, Any] | None]) -> str | None:
    own_expressions = sum(len(e) for t in own_terms if isinstance(e := t.get("matchExpressions"), list))
    if own_expressions * len(groups) > MAX_RESULT_EXPRESSIONS:
        # Each own term is copied once per affinity key: bound what the patch would hold.
        return (
            f"the pod's required node affinity has {own_expressions} match expressions; combined with "
            f"{len(groups)} affinity label keys that is more than {MAX_RESULT_EXPRESSIONS}: simplify the "
            "pod's nodeAffinity or choose fewer affinity labels"
        )
    return None


def _combined_terms(
    own_terms: list[dict[str, Any]], groups: list[dict[str, Any] | None], excluded: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The pod's own terms ANDed with ours (see `_inject_node_affinity`), each made once."""
    new_terms: list[dict[str, Any]] = []
    made: set[bytes] = set()
    ours = [_expression_key(x) for x in excluded]
    group_keys = [_expression_key(g) for g in groups if g is not None]
    for term in own_terms:
        expressions = [e for e in term.get("matchExpressions") or () if isinstance(e, dict)]
        present = {k for e in expressions if (k := _expression_key(e)) is not None}  # linear, not pairwise
        satisfied = all(k in present for k in ours) and (groups == [None] or any(k in present for k in group_keys))
        if satisfied:
            new_terms.append(dict(term))
            continue
        for group in groups:
            combined = list(expressions)
            seen: set[tuple[Any, ...] | None] = set(present)
            for expression in ([group] if group else []) + excluded:
                key = _expression_key(expression)
                if key not in seen:
                    seen.add(key)
                    combined.append(expression)
            new_term = dict(term)
            new_term["matchExpressions"] = combined
            identity = orjson.dumps(new_term, option=orjson.OPT_SORT_KEYS)  # hashed: no pairwise compare
            if identity not in made:
                made.add(identity)
                new_terms.append(new_term)
    return new_terms


def _place_terms(
    target: PodTarget, required: Mapping[str, Any], new_terms: list[dict[str, Any]], patch: PodPatch
) -> None:
    """The patch that puts `new_terms` in place, adding the parents the pod does not have."""
    if not isinstance(target.spec.get("affinity"), dict):
        required_value = {"nodeSelectorTerms": new_terms}
        patch.add(
            "/spec/affinity",
            {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required_value}},
        )
    elif not isinstance(target.spec["affinity"].get("nodeAffinity"), dict):  # absent or null
        patch.add(
            "/spec/affinity/nodeAffinity",
            {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": new_terms}},
        )
    elif not required:
        patch.add(REQUIRED_AFFINITY_PATH, {"nodeSelectorTerms": new_terms})
    else:
        patch.add(f"{REQUIRED_AFFINITY_PATH}/nodeSelectorTerms", new_terms)


# -- S1/S3: priority ---------------------------------------------------------------------------
def _priority(m: _Mutation) -> None:
    classes = m.snapshot.priority_classes
    allowed = m.offer.priority_classes
    chosen = m.target.spec.get("priorityClassName") or None
    existing = classes.get(str(chosen)) if chosen is not None else None
    if (
        existing is not None
        and existing.global_default
        and m.target.annotations.get(PRIORITY_CLASS_ANNOTATION) != chosen
    ):
        # The Priority admission plugin writes the cluster's globalDefault class into every pod
        # that names none, before any webhook runs; the apiserver keeps no trace of who wrote it.
        # So that class counts as not chosen and yields to the project default; a workload that
        # wants it anyway says so with the annotation.
        chosen = None
    if chosen is not None and not isinstance(chosen, str):  # what a hostile pod may write: refused in every mode
        m.errors.append(not_allowed("priority class", [str(chosen)], allowed, m.target.namespace.name))
        return
    if chosen is None:  # the project's or the cluster's default, resolved once per namespace
        priority_class = m.plan.default_class
        if priority_class is None:
            if m.plan.default_class_warning is not None:
                m.warnings.append(m.plan.default_class_warning)
            return
    else:
        resolved = resolve_priority_class(m.offer, chosen)
        name = resolved.value
        if resolved.error:
            if not m.refuse(PRIORITY_CLASS, resolved.error):
                return
            name = chosen  # in warn mode the workload's own class, as if the project offered it
        if name is None or (priority_class := classes.get(name)) is None:
            return
    # S3: the Priority admission plugin ran before us, so priority must follow the class we set.
    m.patch.set_spec("priorityClassName", priority_class.name)
    m.patch.set_spec("priority", priority_class.value)
    m.patch.set_spec("preemptionPolicy", priority_class.preemption_policy)
    m.audit["priority-class"] = priority_class.name


# -- S4: Kueue ---------------------------------------------------------------------------------
def _kueue(m: _Mutation) -> None:
    """The queue (a LocalQueue of the namespace) and the topology unit (a level of the Topology
    behind that queue), checked against the cluster's Kueue objects (`choices.resolve_kueue`)."""
    chosen = m.target.labels.get(KUEUE_QUEUE_LABEL) or None
    chosen_unit = m.target.annotations.get(TOPOLOGY_ANNOTATION)
    resolved = kueue_resolution(
        m.plan,
        m.snapshot,
        None if chosen is None else str(chosen),
        None if chosen_unit is None else str(chosen_unit),
        m.target.kind,
    )
    m.warnings.extend(resolved.warnings)
    for part in (resolved.queue, resolved.topology):
        if part.error is not None:
            # In warn mode a queue or unit that cannot be used is not set (the pod keeps what it
            # named itself): a label naming it would leave the pod waiting in Kueue for good.
            m.refuse(QUEUE_TOPOLOGY, part.error)
    queue = resolved.queue.value
    if queue is None:
        return
    if chosen is None:
        m.patch.set_label(KUEUE_QUEUE_LABEL, queue)
    m.audit["queue"] = queue
    if resolved.node_label is not None and resolved.topology.value is not None:
        m.patch.set_annotation(KUEUE_TOPOLOGY_ANNOTATION, resolved.node_label)
        m.audit["topology"] = resolved.topology.value
        _pod_group(m, resolved.topology.value)


def _pod_group(m: _Mutation, unit: str) -> None:
    """A Deployment's pods that chose a unit go to Kueue as one group (`core.pod_groups`); a group
    the workload names itself is left as it is."""
    if KUEUE_POD_GROUP_LABEL in m.target.labels:
        return
    meta = _map(m.target.pod.get("metadata"))
    answer = deployment_pod_group(meta, m.snapshot.replica_sets, m.target.namespace.name)
    if answer.missing is not None:
        m.errors.append(
            f"ReplicaSet {answer.missing} of this pod is not in this server's cache yet, so the size of its Kueue "
            f"pod group (topology {unit}) is not known; the ReplicaSet controller creates the pod again"
        )
        m.code, m.reason = 503, Reason.OWNER_NOT_CACHED
        return
    if answer.group is None:
        return
    m.patch.set_label(KUEUE_POD_GROUP_LABEL, answer.group.name)
    m.patch.set_annotation(KUEUE_POD_GROUP_COUNT_ANNOTATION, str(answer.group.total))
    # Serving: Kueue keeps the group admitted while its pods are replaced, as a Deployment does.
    m.patch.set_annotation(KUEUE_POD_GROUP_SERVING_ANNOTATION, "true")
    m.audit["pod-group"] = f"{answer.group.name}/{answer.group.total}"


def _kueue_off(m: _Mutation) -> None:
    if TOPOLOGY_ANNOTATION in m.target.annotations:
        m.warnings.append("Kueue is not installed: the topology choice has no effect")
    if KUEUE_QUEUE_LABEL in m.target.labels:
        m.warnings.append("Kueue is not installed: the queue label has no effect")


# -- S5: Run:ai --------------------------------------------------------------------------------
def runai_binding_refusal(namespace: NamespaceInfo, now: float | None, settle_s: float) -> Decision | None:
    """Run:ai on: a pod is admitted only when its namespace was bound before this mutating phase,
    so that the apiserver also calls Run:ai's own webhooks (selected by the namespace's
    `runai/queue` label) for it. Otherwise refused; the shell binds an unbound project first."""
    queue = namespace.runai_queue
    if queue is None:
        return project_not_bound(namespace.name)
    if now is not None and now - namespace.runai_queue_seen_at < settle_s:
        return Decision.deny(
            f"project namespace {namespace.name} was bound to Run:ai project {queue} moments ago; its pods are "
            f"admitted once the binding has reached the Kubernetes API server's cache (within {settle_s:g} s), so "
            "that Run:ai's own admission sees it. Create the pod again (controllers retry on their own)",
            code=503,
            reason=Reason.RUNAI_BINDING_SETTLING,
        )
    return None


def _runai_queue(m: _Mutation) -> None:
    queue = m.target.namespace.runai_queue
    if queue is None:
        return  # runai_binding_refusal refused the pod already
    current = m.target.labels.get(RUNAI_QUEUE_LABEL)
    if current is not None and current != queue:
        # A pod must never run in another project's Run:ai queue.
        m.warnings.append(f"runai/queue {current} replaced by this project's queue {queue}")
    m.patch.set_label(RUNAI_QUEUE_LABEL, queue)
    m.audit["runai-queue"] = queue
    # Run:ai decides preemptibility from these labels, not from spec.priorityClassName's value
    # (the platform's classes are worth far more than Run:ai's threshold of 100): see core.preemptibility.
    for label, value in runai_labels(m.target.kind, m.snapshot.settings).items():
        current = m.target.labels.get(label)
        if current is not None and current != value:
            m.warnings.append(
                f"{label} {str(current)[:60]} replaced by {value}: the platform decides it by workload kind"
            )
        m.patch.set_label(label, value)
        # Audit keys are qualified names under the webhook's name: no second slash.
        m.audit["runai-priority-class" if label == RUNAI_PRIORITY_LABEL else "runai-preemptibility"] = value
