"""`kubectl hopsworks` against the real control plane: the real kubectl finds the plugin on the
PATH and runs it with the user's kubeconfig; the plugin calls the aggregated API through the
apiserver, which authenticates the user, checks RBAC and proxies to the install's replicas.

Three users, each a ServiceAccount with a token of its own in a kubeconfig of its own: a project
member (the built-in `view` role in the project's namespace, which the chart's project-member
ClusterRole joins), a platform admin (the chart's admin ClusterRole, cluster-wide, and nothing
else), and a user RBAC gives nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import sys
from pathlib import Path

import aiohttp
import pytest
import yaml

from tests.e2e.conftest import Cluster, Result
from tests.e2e.runai_steps import DEPARTMENT_LABEL, ensure_department, namespace_meta, wait_bound
from tests.e2e.test_kubectl import turn_runai_on
from webhook.core.admin_view import RunaiAdminView
from webhook.core.gpu_view import GpuAvailability
from webhook.core.offer_view import SchedulingOfferView
from webhook.http.aggregated_api import PREFIX

pytestmark = pytest.mark.slow  # the real control plane and the chart's install

VENV_BIN = str(Path(sys.executable).parent)  # where `pip install` put kubectl-hopsworks


async def user_kubeconfig(cluster: Cluster, home: Path, name: str) -> tuple[Path, str]:
    """A ServiceAccount `name` in a namespace of its own, a kubeconfig with its token, and its
    user name."""
    namespace = await cluster.plain_namespace(f"users-{name}")
    await cluster.ok("create", "serviceaccount", name, "-n", namespace)
    token = (await cluster.ok("create", "token", name, "-n", namespace, "--duration=1h")).strip()
    local = cluster.needs_local("writes kubeconfigs for the control plane's users")
    return local.cp.token_kubeconfig(home / f"{name}.kubeconfig", token), f"{namespace}:{name}"


async def plugin(cluster: Cluster, kubeconfig: Path, *args: str) -> Result:
    """`kubectl hopsworks ARGS` as the kubeconfig's user: kubectl finds kubectl-hopsworks on the PATH."""
    env = {"KUBECONFIG": str(kubeconfig), "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return await cluster.kubectl("hopsworks", *args, env=env)


# About twenty plugin runs, each a kubectl and a Python start: more than the default 300 s when
# the machine is shared, as a hang guard only.
@pytest.mark.timeout(600)
async def test_members_admins_and_strangers_through_the_apiserver(cluster: Cluster, tmp_path: Path) -> None:
    local = cluster.needs_local("needs the Run:ai stand-ins")
    apiservice = await cluster.get("apiservice", "v1.scheduling.hopsworks.ai")
    available = [c for c in apiservice["status"]["conditions"] if c["type"] == "Available"]
    assert available and available[0]["status"] == "True", apiservice["status"]
    await turn_runai_on(cluster)
    await ensure_department(cluster, local, "plugin-dept")
    project = await cluster.project("plugin")
    await wait_bound(cluster, project)

    member, member_sa = await user_kubeconfig(cluster, tmp_path, "member")
    admin, admin_sa = await user_kubeconfig(cluster, tmp_path, "admin")
    stranger, _ = await user_kubeconfig(cluster, tmp_path, "stranger")
    await cluster.ok("create", "rolebinding", "member-view", "--clusterrole=view", f"--serviceaccount={member_sa}",
                     "-n", project)  # fmt: skip
    binding = f"{project}-plugin-admin"
    await cluster.ok("create", "clusterrolebinding", binding, "--clusterrole=hopsworks:scheduling-webhook:admin",
                     f"--serviceaccount={admin_sa}")  # fmt: skip
    try:
        # A project member: the GPU view as a table, and as the object the API answers.
        shown = await plugin(cluster, member, "gpu", "-n", project)
        assert shown.rc == 0, str(shown)
        header, row = shown.stdout.splitlines()[:2]
        assert header.split()[:3] == ["PROJECT", "STATUS", "DEPARTMENT"], shown.stdout
        assert row.split()[0] == project, shown.stdout
        as_json = await plugin(cluster, member, "gpu", "-n", project, "-o", "json")
        assert as_json.rc == 0, str(as_json)
        gpus = GpuAvailability.model_validate(json.loads(as_json.stdout))
        assert gpus.namespace == project and gpus.runai_enabled
        offer = await plugin(cluster, member, "scheduling", "-n", project, "--kind", "notebook", "-o", "yaml")
        assert offer.rc == 0, str(offer)
        assert SchedulingOfferView.model_validate(yaml.safe_load(offer.stdout)).namespace == project
        # ... whom RBAC refuses the admin view and the admin actions, and other projects.
        for args in (("admin", "runai"), ("move", project, "--department", "plugin-dept"),
                     ("delete-department", "plugin-dept"), ("gpu", "-n", "default")):  # fmt: skip
            refused = await plugin(cluster, member, *args)
            assert refused.rc == 1 and "forbidden" in refused.stderr, str(refused)

        # A user RBAC gives nothing: refused, exit 1, with the apiserver's reason.
        refused = await plugin(cluster, stranger, "gpu", "-n", project)
        assert refused.rc == 1 and "forbidden" in refused.stderr and "projectviews" in refused.stderr, str(refused)

        # An admin: the admin view lists the project.
        view = await plugin(cluster, admin, "admin", "runai", "-o", "json")
        assert view.rc == 0, str(view)
        assert project in [p.namespace for p in RunaiAdminView.model_validate(json.loads(view.stdout)).projects]
        # Not a project: bad input, exit 2.
        missing = await plugin(cluster, admin, "gpu", "-n", "kube-public")
        assert missing.rc == 2 and "not a project namespace" in missing.stderr, str(missing)

        # A move, dry run first: the server says what would change and changes nothing.
        dry = await plugin(cluster, admin, "move", project, "--department", "plugin-dept", "--dry-run=server",
                           "-o", "json")  # fmt: skip
        assert dry.rc == 0, str(dry)
        answer = json.loads(dry.stdout)
        assert answer["dry_run"] is True and answer["outcome"] == "moved", answer
        assert answer["message"].startswith(f"would move {project}"), answer
        assert DEPARTMENT_LABEL not in ((await namespace_meta(cluster, project)).get("labels") or {})
        moved = await plugin(cluster, admin, "move", project, "--department", "plugin-dept")
        assert moved.rc == 0, str(moved)
        assert (await namespace_meta(cluster, project))["labels"][DEPARTMENT_LABEL] == "plugin-dept"

        # A department delete, dry run first, then through `scheduling-webhook admin` (no token).
        dry = await plugin(cluster, admin, "delete-department", "plugin-dept", "--dry-run=server", "-o", "json")
        assert dry.rc == 0, str(dry)
        assert json.loads(dry.stdout)["dry_run"] is True
        assert [m["namespace"] for m in json.loads(dry.stdout)["moved"]] == [project]
        assert (await namespace_meta(cluster, project))["labels"][DEPARTMENT_LABEL] == "plugin-dept"
        cli = await asyncio.create_subprocess_exec(
            f"{VENV_BIN}/scheduling-webhook", "admin", "delete-department", "plugin-dept", "--kubeconfig", str(admin),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(cli.communicate(), 120)
        assert cli.returncode == 0, (out, err)
        assert b"1 project(s) moved to the default department" in out, (out, err)
        assert DEPARTMENT_LABEL not in ((await namespace_meta(cluster, project)).get("labels") or {})
    finally:
        await cluster.kubectl("delete", "clusterrolebinding", binding)


AGGREGATED_PORT = 8445  # the Service's port `aggregated`, which the APIService names


async def test_only_the_apiservers_front_proxy_may_name_a_user(cluster: Cluster) -> None:
    """Straight to the aggregated API's port, past the apiserver: without the front-proxy client
    certificate no one gets to send X-Remote-User; with it (only the apiserver has it) the header
    is the caller."""
    local = cluster.needs_local("calls the replicas past the apiserver")
    proxy = local.cp.front_proxy
    assert proxy is not None
    url = f"https://{local.service_ip}:{AGGREGATED_PORT}{PREFIX}/adminviews/runai"
    forged = {"X-Remote-User": "system:admin", "X-Remote-Group": "system:masters"}

    def context(cert: tuple[Path, Path] | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(local.dir / "ca.crt"))
        ctx.check_hostname = False  # the certificate names the Service, not its address
        if cert is not None:
            ctx.load_cert_chain(*cert)
        return ctx

    admin_cert = (local.cp.dir / "pki/admin.crt", local.cp.dir / "pki/admin.key")  # the cluster CA's
    for cert in (None, admin_cert):
        with pytest.raises((aiohttp.ClientError, ssl.SSLError, ConnectionError)):
            async with aiohttp.ClientSession() as session, session.get(url, ssl=context(cert), headers=forged) as r:
                await r.read()
    front = (proxy.cert.cert_file, proxy.cert.key_file)
    async with aiohttp.ClientSession() as session, session.get(url, ssl=context(front), headers=forged) as r:
        assert r.status == 200, await r.text()
    async with aiohttp.ClientSession() as session, session.get(url, ssl=context(front)) as r:
        assert r.status == 401, await r.text()  # the front proxy always names a user; this is no proxied call
