"""The README and manifests/README.md, followed as written.

The newcomer's path is run for real: `make run`'s certificate step and server, then the README's
Install commands and manifests/README.md's for kubectl alone (those that need no cluster), in order,
in a checkout-like folder (helm's are run against a real control plane by
tests/e2e/test_chart_lifecycle.py); the dev server
must keep answering with its certificate verified for `localhost`. The rest checks that the pages
name what the code does (endpoints, uninstall steps), so they cannot drift apart silently.
"""

from __future__ import annotations

import base64
import json
import re
import shlex
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from tests.support import chart
from tests.support.apps import cache_app
from tests.support.https import LOOPBACK
from webhook.console.signouts import SIGNOUTS_CONFIGMAP
from webhook.core.admission_policies import PARAMS_NAME, POLICY_NAME
from webhook.quota.reservations import RESERVATIONS_LABEL
from webhook.runai.binding import BINDING_ANNOTATION, FINALIZER
from webhook.runtime import ServeOptions
from webhook.snapshot import ADMISSION_POLICIES_LABEL, RUNAI_MOVE_ANNOTATION, RUNAI_PROJECT_ID_LABEL
from webhook.state.store import ClusterState
from webhook.tls.issuing import make_ca

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
MANIFESTS_README = (ROOT / "manifests" / "README.md").read_text()
BIN = Path(sys.executable).parent


def section(text: str, heading: str) -> str:
    start = text.index(heading)
    rest = text[start + len(heading) :]
    following = re.search(r"^#{2,3} ", rest, re.MULTILINE)  # a `# comment` in a code block is not a heading
    return rest[: following.start()] if following else rest


def first_bash_block(text: str) -> list[str]:
    """The commands of the first ```bash block, continuation lines joined, comments dropped."""
    block = re.search(r"```bash\n(.*?)```", text, re.DOTALL)
    assert block, text[:200]
    joined = block.group(1).replace("\\\n", " ")
    return [line.split("  #")[0].strip() for line in joined.splitlines() if line.strip()]


# -- the newcomer's path, run -------------------------------------------------------------------


def mutate_over_https(port: int, ca_file: Path) -> dict[str, object]:
    """The README's curl: POST the shipped request to https://localhost, verifying the dev CA and the name."""
    context = ssl.create_default_context(cafile=str(ca_file))
    body = (ROOT / "examples" / "requests" / "notebook-zone.json").read_bytes()
    request = urllib.request.Request(
        f"https://localhost:{port}/mutate/pods", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, context=context, timeout=5) as resp:
        return json.loads(resp.read())["response"]


def make_certs(dev_certs: Path) -> str:
    """`make run`'s certificate step, from the Makefile itself, with the venv running these tests
    (`-o`: never reinstalled from inside a test)."""
    venv = Path(sys.prefix)
    options = [
        "--no-print-directory",
        "-C",
        str(ROOT),
        "-o",
        str(venv / ".installed"),
        "-o",
        str(venv / ".installed-run"),
    ]
    done = subprocess.run(
        ["make", *options, "certs", f"DEV_CERTS={dev_certs}", f"VENV={venv}", f"PYTHON={sys.executable}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A folder laid out like the repository's root (examples/, manifests/), with no certs yet."""
    folder = tmp_path / "checkout"
    folder.mkdir()
    for name in ("examples", "manifests"):
        (folder / name).symlink_to(ROOT / name)
    return folder


@pytest.fixture
def dev_server(checkout: Path) -> Iterator[int]:
    """What `make run` does: the certificate step, then `serve` on 127.0.0.1 from examples/cluster."""
    make_certs(checkout / "certs" / "dev")
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        port = probe.getsockname()[1]
    argv = [str(BIN / "scheduling-webhook"), "serve", "--state", "examples/cluster", "--certs", "certs/dev"]
    argv += ["--host", LOOPBACK, "--port", str(port)]
    log = checkout.parent / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=checkout, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                mutate_over_https(port, checkout / "certs" / "dev" / "ca.crt")
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def run_documented(commands: list[str], cwd: Path) -> None:
    for command in commands:
        argv = shlex.split(command)
        if argv[0].endswith("scheduling-webhook"):
            argv[0] = str(BIN / "scheduling-webhook")
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, (command, done.stdout, done.stderr)


def test_readme_then_manifests_readme_never_break_make_run(checkout: Path, dev_server: int) -> None:
    dev = checkout / "certs" / "dev"
    dev_files = {p.name: p.read_bytes() for p in dev.iterdir()}

    readme_steps = first_bash_block(section(README, "## Install"))
    kubectl_steps = first_bash_block(section(MANIFESTS_README, "## Install with kubectl alone"))
    cluster = ("kubectl", "helm", "for", "CA=$(base64")
    local = [c for c in readme_steps + kubectl_steps if c.split()[0] not in cluster and not c.startswith(cluster)]
    assert any("certs" in c.split() for c in local) and any("console-keys" in c.split() for c in local)
    run_documented(local, checkout)

    # The dev server's certificate is untouched, and it still answers for localhost.
    assert {p.name: p.read_bytes() for p in dev.iterdir()} == dev_files
    answer = mutate_over_https(dev_server, dev / "ca.crt")
    assert answer["allowed"] is True and answer["auditAnnotations"]
    # `make run` again keeps it: nothing to re-issue.
    assert "kept" in make_certs(dev)

    # The cluster got a CA of its own, and the documented patches put that one in every webhook.
    cluster_ca = (checkout / "certs" / "cluster" / "ca.crt").read_bytes()
    assert cluster_ca != dev_files["ca.crt"]
    assert "CA=$(base64 -w0 certs/cluster/ca.crt)" in kubectl_steps
    patches = " ".join(c for c in kubectl_steps if "kubectl patch" in c)
    for obj in (o for _, text in sorted(chart.plain_manifests().items()) for o in yaml.safe_load_all(text)):
        if obj["kind"].endswith("WebhookConfiguration"):
            assert f"{obj['kind'].lower()} {obj['metadata']['name']}" in patches
            # One patch per webhook of the configuration, by index.
            indexes = " ".join(map(str, range(len(obj["webhooks"]))))
            assert f"for i in {indexes}; do kubectl patch {obj['kind'].lower()} " in patches, (indexes, patches)


def test_make_run_replaces_a_dev_certificate_lacking_localhost(checkout: Path) -> None:
    """The trap of old: the install step wrote a Service-only certificate where the dev server reads."""
    dev = checkout / "certs" / "dev"
    run_documented(["scheduling-webhook certs --out certs/dev --namespace hopsworks"], checkout)
    printed = make_certs(dev)
    assert "re-issuing" in printed and "lacks localhost, 127.0.0.1" in printed


# -- the pages name what the code does ----------------------------------------------------------


def test_readme_lists_every_endpoint() -> None:
    state = ClusterState("hopsworks")
    app = cache_app(state)
    paths = {r.resource.canonical for r in app.router.routes() if r.resource is not None}
    # The cluster-only APIs, registered by the runtime against an apiserver.
    from webhook.http.admin_api import DELETE_DEPARTMENT_PATH, MOVE_PATH
    from webhook.http.scheduling_api import SCHEDULING_PATH

    paths |= {"/api/v1/projects/{namespace}/gpu", "/api/v1/admin/runai", MOVE_PATH, DELETE_DEPARTMENT_PATH}
    paths.add(SCHEDULING_PATH)
    # The aggregated API's, on --aggregated-port (what it serves does not matter for its paths).
    from webhook.http.aggregated_api import aggregated_routes, requestheader_config

    nothing: Any = None
    config = requestheader_config({"requestheader-client-ca-file": "CA"})
    paths |= {r.path for r in aggregated_routes(nothing, nothing, config) if isinstance(r, web.RouteDef)}
    endpoints = section(README, "### Endpoints")
    for path in paths:
        assert f"{path}`" in endpoints, path


def test_gpu_and_admin_api_paths_in_the_readme_are_the_ones_served() -> None:
    import inspect

    from webhook.http import gpu_api

    source = inspect.getsource(gpu_api.gpu_api_routes)
    for path in re.findall(r'"(/api/v1/[^"]+)"', source):
        assert path in README, path


def test_readme_says_what_a_newcomer_asks() -> None:
    two = section(README, "## The two commands")
    assert re.findall(r"^make \w+", first_bash_block(two)[0] + "\n" + first_bash_block(two)[1], re.M) == [
        "make run",
        "make test",
    ]
    assert "make run PORT=" in two
    assert "HTTP 200" in README and '"allowed": false' in README
    assert "kubernetes_asyncio" in README and "synchronous" in README
    ask = section(README, "### Ask it something")
    assert "curl -sS" in ask and "examples/requests/notebook-zone.json" in ask and "../shared" not in ask
    for name in ("refused-priority.json", "gpu-notebook.json", "gpu-notebook-patched.json", "kueue-pod.json"):
        assert name in ask and (ROOT / "examples" / "requests" / name).is_file()


def test_uninstall_covers_everything_the_server_leaves_behind() -> None:
    with_helm = section(MANIFESTS_README, "## Uninstall")
    assert first_bash_block(with_helm) == ["helm uninstall scheduling-webhook --namespace hopsworks --wait"]
    for what in (FINALIZER, RUNAI_PROJECT_ID_LABEL, BINDING_ANNOTATION, "/runai-move", "runai-projects-left"):
        assert what in with_helm, what
    uninstall = section(MANIFESTS_README, "### Uninstall with kubectl alone")
    commands = first_bash_block(uninstall)
    deletes = [c for c in commands if c.startswith("kubectl") and " delete " in c]
    assert deletes and all("--ignore-not-found" in c for c in deletes), deletes
    ca = base64.b64encode(make_ca(days=1).cert_pem).decode()
    rendered = chart.render({"certs": {"mode": "secret", "secret": {"caBundle": ca}}})
    for obj in rendered:
        if obj["kind"].endswith("WebhookConfiguration"):
            assert obj["metadata"]["name"] in uninstall
    deployment = next(o for o in rendered if o["kind"] == "Deployment")
    tls_secret = next(v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "certs")
    console_secret = next(
        v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "console-session-keys"
    )
    for needed in (
        f"secret {tls_secret['secret']['secretName']}",
        f"{console_secret['secret']['secretName']} --ignore-not-found",
        f"configmap {SIGNOUTS_CONFIGMAP}",
        f"configmap -l {RESERVATIONS_LABEL}",
        f"lease {ServeOptions().lease_name}",
        FINALIZER,
        f"{RUNAI_PROJECT_ID_LABEL}-",
        f"{BINDING_ANNOTATION}-",
        f"{RUNAI_MOVE_ANNOTATION}-",
        f"{ADMISSION_POLICIES_LABEL}-",
        f"mutatingadmissionpolicy {POLICY_NAME}",
        f"validatingadmissionpolicy {POLICY_NAME}",
        f"metadata.name={PARAMS_NAME}",
    ):
        assert needed in uninstall, needed
    for what in (ADMISSION_POLICIES_LABEL, POLICY_NAME, PARAMS_NAME):
        assert what in with_helm, what


def test_the_image_is_built_from_the_constraints_before_the_code() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text().splitlines()
    steps = [line for line in dockerfile if re.match(r"^(FROM|COPY|RUN)\b", line)]

    def index(pattern: str) -> int:
        return next(i for i, line in enumerate(steps) if re.search(pattern, line))

    # Builder: dependencies from constraints.txt, then the code.
    assert index(r"COPY constraints\.txt") < index(r"RUN pip wheel .*-r constraints\.txt") < index(r"COPY webhook")
    assert "constraints.txt" in (ROOT / ".dockerignore").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "-c constraints.txt" in makefile and "constraints.txt" in makefile.split("$(RUN_STAMP):")[1].splitlines()[0]
    image = next(
        c["image"]
        for o in yaml.safe_load_all((ROOT / "manifests" / "06-deployment.yaml").read_text())
        for c in o["spec"]["template"]["spec"]["containers"]
    )
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version and image == f"scheduling-webhook:{version.group(1)}"
    assert f"`{image}`" in MANIFESTS_README and "docker push" in MANIFESTS_README


def test_constraints_pin_every_runtime_dependency() -> None:
    import tomllib

    from packaging.requirements import Requirement

    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[re.sub(r"[-_.]+", "-", name).lower()] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for dependency in project["dependencies"]:
        requirement = Requirement(dependency)
        name = re.sub(r"[-_.]+", "-", requirement.name).lower()
        assert name in pins, name
        assert requirement.specifier.contains(pins[name]), (name, pins[name])


def test_renewal_and_cert_manager_are_documented() -> None:
    renewal = section(MANIFESTS_README, "## Certificate renewal")
    assert "webhook_serving_certificate_expiry_timestamp_seconds" in renewal
    assert "certs.mode: certManager" in renewal and "renewBeforeDays" in section(MANIFESTS_README, "## Certificates")
    assert "inject-ca-from" in section(MANIFESTS_README, "## Certificates")
    admin = section(MANIFESTS_README, "## Reaching the server as an admin")
    # Through the apiserver with the user's kubeconfig: no token pasted, no port-forward.
    assert "kubectl hopsworks move" in admin and "--dry-run=server" in admin
    assert "port-forward" not in admin and "create token" not in admin
    assert "extension-apiserver-authentication" in admin
