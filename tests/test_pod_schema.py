"""The pod schema (webhook/pod_schema.py) against the full path it stands in for.

Two promises: a review the schema takes is one the full path takes, whose object passes
`object_errors`, and which every rule decides as it decides the full parse; a review it does not
take is left to the full path (`parse_pod_review` answers None), whatever is odd about it.
"""

from __future__ import annotations

import copy
import re
import types
import typing
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes_asyncio.client import models

from tests import test_quota, test_scheduling
from tests.support.cluster import cluster_state
from tests.support.reviews import pod_review
from webhook.admission import BadReview, object_errors, parse_pod_review, parse_review
from webhook.core.quota import validate_pod
from webhook.core.scheduling import mutate_pod
from webhook.pod_schema import DROPPED

WEBHOOK = Path(__file__).resolve().parents[1] / "webhook"
CONTAINER = "io.k8s.api.core.v1.Container"
POD_SPEC = "io.k8s.api.core.v1.PodSpec"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"


def without_dropped(request: dict[str, Any]) -> dict[str, Any]:
    """The full parse of a request as the schema should give it: the dropped fields taken out."""
    request = copy.deepcopy(request)
    for key in ("object", "oldObject"):
        pod = request.get(key)
        if not isinstance(pod, dict):
            continue
        for name in DROPPED[OBJECT_META]:
            (pod.get("metadata") or {}).pop(name, None)
        spec = pod.get("spec") or {}
        for name in DROPPED[POD_SPEC]:
            spec.pop(name, None)
        for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
            for name in DROPPED[CONTAINER]:
                container.pop(name, None)
    return request


def both(review: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(full parse, schema parse) of a review the schema must take: any the apiserver sends. One
    whose pod holds a null is left to the full path (the apiserver leaves empty fields out)."""
    body = orjson.dumps(review)
    version, full = parse_review(body)
    typed = parse_pod_review(body)
    if typed is None:
        assert b"null" in orjson.dumps(review["request"]["object"]), "the pod schema refused a well-formed review"
        return full, full
    assert typed[0] == version
    assert object_errors(full) is None
    assert typed[1] == without_dropped(full)
    return full, typed[1]


@pytest.mark.parametrize("case", test_scheduling.CASES, ids=[c.id for c in test_scheduling.CASES])
def test_the_scheduling_table_decides_alike(case: test_scheduling.Case) -> None:
    snap = test_scheduling.snapshot(namespaces=test_scheduling.NAMESPACES, extra=case.extra, **case.settings)
    review = case.as_review()
    full, typed = both(review)
    assert mutate_pod(typed, snap) == mutate_pod(full, snap)


@pytest.mark.parametrize("case", test_quota.CASES, ids=[c.id for c in test_quota.CASES])
def test_the_quota_table_decides_alike(case: test_quota.Case) -> None:
    state = cluster_state(
        namespaces=[test_quota.BOUND, test_quota.UNBOUND, test_quota.MOVING_NS], extra=case.pods,
        run_ai_enable=case.run_ai,
    )  # fmt: skip
    snap = state.snapshot()
    snap.runai_reachable = case.reachable
    snap.runai_missing = case.missing
    if case.deserved is not None:
        snap.runai_projects = {
            "vision": test_quota.RunaiProjectInfo(
                id="7", name="vision", namespace="vision", deserved_gpus=case.deserved
            )
        }
    snap.gpu_reservations = {
        "vision": {
            k: test_quota.GpuReservation(key=k, namespace="vision", gpus=g, expires_at=test_quota.NOW + 60)
            for k, g in case.reservations.items()
        }
    }
    queue = {"runai/queue": case.queue, test_quota.PREEMPTIBILITY: case.preemptibility} if case.queue else {}
    labels = {**case.labels, **queue}
    review = pod_review(
        case.namespace, labels=labels, annotations=case.annotations, gpus=case.gpus, owners=case.owners, spec=case.spec
    )
    full, typed = both(review)
    now = test_quota.NOW
    assert validate_pod(typed, snap, now=now) == validate_pod(full, snap, now=now)


def a_review(**object_fields: Any) -> dict[str, Any]:
    """A small pod CREATE review, written here (no shared fixture needed)."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "churn", "labels": {"app": "x"}},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "i",
                    "env": [{"name": "A", "value": "1"}],
                    "volumeMounts": [{"name": "v", "mountPath": "/v"}],
                    "resources": {"limits": {"cpu": "1", "nvidia.com/gpu": 1}},
                }
            ],
            "volumes": [{"name": "v", "emptyDir": {}}],
        },
    }
    pod.update(object_fields)
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "churn",
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


def test_what_no_rule_reads_is_not_decoded() -> None:
    _, typed = both(a_review())
    container = typed["object"]["spec"]["containers"][0]
    assert "env" not in container and "volumeMounts" not in container
    assert "volumes" not in typed["object"]["spec"]
    assert container["resources"] == {"limits": {"cpu": "1", "nvidia.com/gpu": 1}}
    assert typed["options"] == {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}


def _set(path: str, value: Any) -> Any:
    def change(review: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = review
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value

    return change


C0 = "request.object.spec.containers.0"
# Reviews the schema leaves to the full path: each is odd in one place (whether the full path then
# refuses it, or passes it because the rules do not read it, is that path's business).
NOT_TAKEN = {
    "another kind": _set("request.kind.kind", "Deployment"),
    "a pods subresource's kind": _set("request.kind", {"group": "", "version": "v1", "kind": "Binding"}),
    "no uid": _set("request.uid", ""),
    "an operation no apiserver sends": _set("request.operation", "PATCH"),
    "an unknown apiVersion": _set("apiVersion", "admission.k8s.io/v2"),
    "another envelope kind": _set("kind", "AdmissionResponse"),
    "a null dryRun": _set("request.dryRun", None),
    "a null metadata": _set("request.object.metadata", None),
    "a label that is a number": _set("request.object.metadata.labels", {"app": 1}),
    "an annotation that is null": _set("request.object.metadata.annotations", {"a": None}),
    "ownerReferences that are not objects": _set("request.object.metadata.ownerReferences", ["rs"]),
    "a priorityClassName that is a number": _set("request.object.spec.priorityClassName", 7),
    "containers that are an object": _set("request.object.spec.containers", {"c": {}}),
    "a limit that is a boolean": _set(f"{C0}.resources.limits", {"nvidia.com/gpu": True}),
    "a request that is a list": _set(f"{C0}.resources.requests", {"cpu": ["1"]}),
    "a null affinity": _set("request.object.spec.affinity", None),
    "a match value that is a number": _set(
        "request.object.spec.affinity",
        {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": [1]}]}]
                }
            }
        },
    ),
    "an object that is a list": _set("request.object", []),
    "no request": lambda review: review.pop("request"),
}


@pytest.mark.parametrize("name", list(NOT_TAKEN))
def test_reviews_the_schema_does_not_take_go_to_the_full_path(name: str) -> None:
    review = a_review()
    NOT_TAKEN[name](review)
    assert parse_pod_review(orjson.dumps(review)) is None


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b'{"request": {}} trailing',
        b"[" * 100_000 + b"]" * 100_000,
        orjson.dumps(a_review()).replace(b'"value":"1"', b'"value":"\xff"'),  # invalid UTF-8, in env
        orjson.dumps(a_review()).replace(b'"value":"1"', b'"value":"\\ud800"'),  # a lone surrogate
        orjson.dumps(a_review()).replace(b'"value":"1"', b'"value":' + b"[" * 5000 + b"]" * 5000),
        orjson.dumps(a_review()).replace(b'"value":"1"', b'"value":NaN'),
    ],
    ids=["empty", "unfinished", "trailing", "deep", "bad utf-8 skipped", "surrogate skipped", "deep skipped", "NaN"],
)
def test_bodies_the_full_path_refuses_are_left_to_it(body: bytes) -> None:
    assert parse_pod_review(body) is None
    with pytest.raises(BadReview):
        parse_review(body)


def test_non_ascii_text_is_taken() -> None:
    review = a_review()
    review["request"]["object"]["metadata"]["annotations"] = {"note": "Grüße, 東京"}
    review["request"]["object"]["spec"]["containers"][0]["env"][0]["value"] = "é"
    both(review)


def test_a_number_no_double_holds_in_a_skipped_field_is_taken() -> None:
    # The one known difference: msgspec skips a number it would not decode, orjson refuses it.
    # No rule reads the field and no apiserver sends such a number (it stores JSON it parsed).
    body = orjson.dumps(a_review()).replace(b'"value":"1"', b'"value":1e400')
    with pytest.raises(BadReview):
        parse_review(body)
    assert parse_pod_review(body) is not None


# -- the field lists: every field of the API's definitions is named or dropped, none unknown
# (but the few that only some Kubernetes versions define)


def _fields(definition: type) -> set[str]:
    return set(getattr(definition, "__annotations__", {}))


SCHEMA_PARTS = {
    "V1ObjectMeta": ("ObjectMetaIn", OBJECT_META),
    "V1PodSpec": ("PodSpecIn", POD_SPEC),
    "V1Container": ("ContainerIn", CONTAINER),
    "V1ResourceRequirements": ("ResourceRequirementsIn", ""),
    "V1Affinity": ("AffinityIn", ""),
    "V1NodeAffinity": ("NodeAffinityIn", ""),
    "V1NodeSelector": ("NodeSelectorIn", ""),
    "V1NodeSelectorTerm": ("NodeSelectorTermIn", ""),
    "V1NodeSelectorRequirement": ("NodeSelectorRequirementIn", ""),
    "V1Pod": ("PodIn", ""),
}


@pytest.mark.parametrize("model", list(SCHEMA_PARTS))
def test_the_schema_names_every_field_of_the_client_models(model: str) -> None:
    # The generated client is built from the API's OpenAPI (tests/e2e/test_pod_schema.py asks the
    # real apiserver too): a field the schema neither names nor drops would vanish from the pod.
    from webhook import pod_schema

    part, definition = SCHEMA_PARTS[model]
    api = set(getattr(models, model).attribute_map.values())
    named = _fields(getattr(pod_schema, part))
    dropped = DROPPED.get(definition, frozenset())
    assert not api - named - dropped, f"neither named nor dropped: {sorted(api - named - dropped)}"
    assert named - api <= pod_schema.OF_SOME_VERSIONS.get(part, frozenset()), f"unknown {sorted(named - api)}"
    assert not named & dropped


def test_no_module_reads_a_dropped_field() -> None:
    # A rule that reads one of them would see it missing. Outside the request path: the CLI's
    # "command" argument, `review -` reading stdin, the pod cache's trimming of managedFields.
    allowed = {("command", "cli.py"), ("stdin", "review.py"), ("managedFields", "state/watches.py")}
    for name in sorted(set().union(*DROPPED.values())):
        quoted = re.compile(rf"[\"']{name}[\"']")
        for path in WEBHOOK.rglob("*.py"):
            where = str(path.relative_to(WEBHOOK))
            if where == "pod_schema.py" or (name, where) in allowed:
                continue
            assert not quoted.search(path.read_text()), f"{where} reads {name!r}, which the pod schema drops"


# -- a property: whatever the schema takes decodes as the full path, the dropped fields aside

SCALAR = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8)
JSON = st.recursive(
    SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10,
)
# Where a good value is an object of known fields, the odd one is JSON without objects: one with
# unknown fields is a good one to the schema (it keeps the fields the API defines), and so is a
# list of them in place of the containers.
NOT_AN_OBJECT = SCALAR | st.lists(SCALAR, max_size=3)


def odd_or(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(good, NOT_AN_OBJECT)


QUANTITY = odd_or(st.sampled_from(["1", "500m", 2, 0.5, "1Gi"]))


def known(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """An object of some of these fields, or something odd in its place."""
    return odd_or(st.fixed_dictionaries({}, optional=fields))


def some(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return odd_or(st.lists(strategy, max_size=2))


EXPRESSION = known(key=odd_or(st.just("zone")), operator=odd_or(st.just("In")), values=some(odd_or(st.just("a"))))
AFFINITY = known(
    nodeAffinity=known(
        requiredDuringSchedulingIgnoredDuringExecution=known(
            nodeSelectorTerms=some(known(matchExpressions=some(EXPRESSION)))
        ),
        preferredDuringSchedulingIgnoredDuringExecution=JSON,
    ),
    podAntiAffinity=JSON,
)
CONTAINER_ST = st.fixed_dictionaries(
    {},
    optional={
        "name": odd_or(st.just("c")),
        "env": JSON,
        "command": JSON,
        "resources": odd_or(
            st.fixed_dictionaries(
                {}, optional={"limits": odd_or(st.dictionaries(st.sampled_from(["cpu", "nvidia.com/gpu"]), QUANTITY))}
            )
        ),
    },
)
POD_ST = st.fixed_dictionaries(
    {},
    optional={
        "metadata": odd_or(
            st.fixed_dictionaries(
                {},
                optional={
                    "name": odd_or(st.just("p")),
                    "labels": odd_or(st.dictionaries(st.sampled_from(["a", "b"]), st.text(max_size=4) | JSON)),
                    "annotations": JSON,
                    "managedFields": JSON,
                    "ownerReferences": odd_or(st.lists(st.fixed_dictionaries({"kind": JSON}), max_size=2)),
                },
            )
        ),
        "spec": odd_or(
            st.fixed_dictionaries(
                {},
                optional={
                    "containers": odd_or(st.lists(CONTAINER_ST, max_size=2)),
                    "priorityClassName": odd_or(st.just("normal")),
                    "volumes": JSON,
                    "affinity": AFFINITY,
                    "nodeSelector": JSON,
                },
            )
        ),
        "status": JSON,
    },
)


@settings(max_examples=300, deadline=None)
@given(pod=POD_ST, namespace=st.sampled_from(["churn", "plain"]))
def test_whatever_the_schema_takes_decodes_as_the_full_path(pod: dict[str, Any], namespace: str) -> None:
    review = a_review()
    review["request"]["namespace"] = namespace
    review["request"]["object"] = pod
    body = orjson.dumps(review)
    typed = parse_pod_review(body)
    if typed is None:
        return
    version, full = parse_review(body)
    assert typed == (version, without_dropped(full))
    assert object_errors(full) is None


# -- the schema's types against the object shape -------------------------------------------------
# A review the schema takes must be one whose pod passes `object_errors`: every field the pod's
# shape (`admission.SHAPES["Pod"]`) names is typed in the schema at least as strictly as the shape
# asks. Walked field by field, so that a field added to the shape and not to the schema fails here.


def _stricter_or_equal(hint: Any, shape: Any, where: str) -> list[str]:
    from typing import get_args, get_origin, get_type_hints, is_typeddict

    from webhook.admission import QUANTITY, STRING, Fields, ListOf, MapOf

    if get_origin(hint) is typing.Union or isinstance(hint, types.UnionType):
        # `X | None` (an object or oldObject that may be null) holds the shape when X does.
        args = [a for a in get_args(hint) if a is not type(None)]
        hint = args[0] if len(args) == 1 else hint
    if shape == STRING:
        return [] if hint is str else [f"{where}: typed {hint}, the shape asks for a string"]
    if isinstance(shape, MapOf):
        if get_origin(hint) is not dict:
            return [f"{where}: typed {hint}, the shape asks for a map"]
        value = get_args(hint)[1]
        if shape.values == STRING and value is not str:
            return [f"{where}: values typed {value}, the shape asks for strings"]
        if shape.values == QUANTITY and set(get_args(value) or (value,)) - {str, int, float}:
            return [f"{where}: values typed {value}, the shape asks for quantities"]
        return []
    if isinstance(shape, ListOf):
        if get_origin(hint) is not list:
            return [f"{where}: typed {hint}, the shape asks for a list"]
        return _stricter_or_equal(get_args(hint)[0], shape.item, f"{where}[]")
    assert isinstance(shape, Fields)
    if get_origin(hint) is dict and not shape.fields:
        return []
    if not is_typeddict(hint):
        return [f"{where}: typed {hint}, the shape asks for an object"]
    hints = get_type_hints(hint)
    problems = []
    for key, child in shape.fields:
        if key not in hints:
            problems.append(f"{where}.{key}: not in the schema, which would skip a field the shape checks")
        else:
            problems.extend(_stricter_or_equal(hints[key], child, f"{where}.{key}"))
    return problems


def test_the_schema_types_every_field_of_the_pod_shape_at_least_as_strictly() -> None:
    from webhook.admission import SHAPES
    from webhook.pod_schema import PodIn

    assert _stricter_or_equal(PodIn, SHAPES["Pod"], "pod") == []


class _LenientSpec(typing.TypedDict, total=False):
    priorityClassName: Any


class _LenientPod(typing.TypedDict, total=False):
    metadata: dict[str, Any]
    spec: _LenientSpec


def test_the_walk_of_the_types_sees_a_lenient_field() -> None:
    from webhook.admission import SHAPES

    problems = _stricter_or_equal(_LenientPod, SHAPES["Pod"], "pod")
    assert "pod.metadata: typed dict[str, typing.Any], the shape asks for an object" in problems
    assert "pod.spec.priorityClassName: typed typing.Any, the shape asks for a string" in problems
    assert "pod.spec.containers: not in the schema, which would skip a field the shape checks" in problems
