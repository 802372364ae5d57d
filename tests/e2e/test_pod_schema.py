"""The pod schema's field lists against the real apiserver's OpenAPI: a field the API defines that
the schema neither names nor drops would be missing from every pod the rules read."""

from __future__ import annotations

import json

import pytest

from tests.support.control_plane.cluster import ControlPlane
from webhook import pod_schema

pytestmark = pytest.mark.slow  # the real control plane (started once per session)

PARTS = {
    "PodIn": "io.k8s.api.core.v1.Pod",
    "ObjectMetaIn": "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
    "PodSpecIn": "io.k8s.api.core.v1.PodSpec",
    "ContainerIn": "io.k8s.api.core.v1.Container",
    "ResourceRequirementsIn": "io.k8s.api.core.v1.ResourceRequirements",
    "AffinityIn": "io.k8s.api.core.v1.Affinity",
    "NodeAffinityIn": "io.k8s.api.core.v1.NodeAffinity",
    "NodeSelectorIn": "io.k8s.api.core.v1.NodeSelector",
    "NodeSelectorTermIn": "io.k8s.api.core.v1.NodeSelectorTerm",
    "NodeSelectorRequirementIn": "io.k8s.api.core.v1.NodeSelectorRequirement",
}


def test_the_pod_schema_names_every_field_the_apiserver_defines(real_control_plane: ControlPlane) -> None:
    served = json.loads(real_control_plane.kubectl("get", "--raw", "/openapi/v3/api/v1").stdout)
    schemas = served["components"]["schemas"]
    for part, definition in PARTS.items():
        api = set(schemas[definition]["properties"])
        named = set(getattr(pod_schema, part).__annotations__)
        dropped = pod_schema.DROPPED.get(definition, frozenset())
        assert not api - named - dropped, f"{part}: neither named nor dropped: {sorted(api - named - dropped)}"
        of_some_versions = pod_schema.OF_SOME_VERSIONS.get(part, frozenset())
        assert named - api <= of_some_versions, f"{part}: unknown {sorted(named - api)}"
    assert set(pod_schema.DROPPED) <= set(PARTS.values())
