"""manifests/*.yaml is the chart rendered by the real helm (`make manifests`): one source."""

from __future__ import annotations

import yaml

from tests.support import chart


def test_the_plain_yaml_is_the_chart_rendered() -> None:
    wanted = chart.plain_manifests()
    present = {p.name: p.read_text() for p in chart.PLAIN_DIR.glob("*.yaml")}
    assert sorted(present) == sorted(wanted), "files differ from the chart's templates: run `make manifests`"
    drifted = [name for name in wanted if present[name] != wanted[name]]
    assert not drifted, f"{drifted} differ from `helm template` of the chart: run `make manifests`"


def test_the_plain_yaml_needs_no_helm_to_apply() -> None:
    for name, text in chart.plain_manifests().items():
        assert "helm.sh/hook" not in text, name  # nothing would run a hook
        for obj in yaml.safe_load_all(text):
            for hook in obj.get("webhooks") or ():
                assert "caBundle" not in hook["clientConfig"], name  # the installer's CA (manifests/README.md)
