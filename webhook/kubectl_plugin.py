"""`kubectl hopsworks ...` (the `kubectl-hopsworks` program): the server's views and admin actions
from the user's kubeconfig, through the apiserver.

kubectl runs any `kubectl-NAME` on the PATH as `kubectl NAME`; `pip install scheduling-webhook`
installs this one. It reads the kubeconfig as kubectl does (--kubeconfig, else $KUBECONFIG, else
~/.kube/config; --context; -n, else the context's namespace) and calls the aggregated API
`scheduling.hopsworks.ai/v1` (webhook.http.aggregated_api) on the apiserver, with the user's own
credentials: the apiserver authenticates them and RBAC decides, so no token is pasted and no
port-forward is made.

    kubectl hopsworks gpu -n PROJECT                        the GPU view
    kubectl hopsworks scheduling -n PROJECT [--kind K]      what a workload may choose
    kubectl hopsworks admin runai                           the Run:ai admin view
    kubectl hopsworks move PROJECT --department D [--dry-run=server]
    kubectl hopsworks delete-department D [--dry-run=server]
    kubectl hopsworks review -f FILE --state DIR            the offline review (webhook.review)

Output as kubectl's: a table by default, `-o json|yaml` the object the API answers. Exit codes:
0 allowed (done, or shown), 1 refused (RBAC, the server, or a review's refusal), 2 bad input or
no answer (an unreadable kubeconfig, an unknown project, an unreachable apiserver).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import quote

import yaml
from kubernetes_asyncio import config
from kubernetes_asyncio.client import ApiClient, Configuration

from webhook.http.aggregated_api import PREFIX

EXIT_OK, EXIT_REFUSED, EXIT_BAD_INPUT = 0, 1, 2
TIMEOUT_S = 120.0  # a department delete moves its projects one at a time
OUTPUTS = ("table", "json", "yaml")


class PluginError(Exception):
    """Bad input or no answer: exit 2 with this message."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any  # the JSON the API answered, or its text when it is no JSON


def _kubeconfig_file(path: str | None) -> str:
    # As kubectl: the flag, else $KUBECONFIG (files joined by ':' are merged), else ~/.kube/config.
    return path or os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")


def context_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace of the kubeconfig's context, as kubectl takes it when -n is not given."""
    try:
        contexts, current = config.list_kube_config_contexts(_kubeconfig_file(kubeconfig))
    except (config.ConfigException, OSError) as exc:
        raise PluginError(f"cannot read the kubeconfig: {exc}") from None
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    if context and chosen is None:
        raise PluginError(f"context {context!r} not found in the kubeconfig")
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


async def _api_client(kubeconfig: str | None, context: str | None) -> ApiClient:
    configuration = Configuration()
    try:
        await config.load_kube_config(
            config_file=_kubeconfig_file(kubeconfig), context=context, client_configuration=configuration
        )
    except (config.ConfigException, OSError) as exc:
        raise PluginError(f"cannot read the kubeconfig: {exc}") from None
    return ApiClient(configuration)


async def call(
    kubeconfig: str | None,
    context: str | None,
    method: str,
    path: str,
    *,
    query: Sequence[tuple[str, str]] = (),
    body: Any = None,
) -> Answer:
    """One request to the apiserver as the kubeconfig's user; any HTTP status is an answer."""
    api = await _api_client(kubeconfig, context)
    try:
        response = await api.call_api(
            path,
            method,
            query_params=list(query),
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
            _preload_content=False,
            _request_timeout=TIMEOUT_S,
        )
        try:
            raw = await response.read()
        finally:
            response.release()
    except (OSError, TimeoutError) as exc:
        raise PluginError(f"cannot reach the apiserver at {api.configuration.host}: {exc}") from None
    except Exception as exc:  # the client library's own errors (TLS, refresh of an exec credential)
        raise PluginError(f"request to {api.configuration.host} failed: {type(exc).__name__}: {exc}") from None
    finally:
        await api.close()
    text = raw.decode(errors="replace")
    try:
        return Answer(int(response.status), json.loads(text))
    except ValueError:
        return Answer(int(response.status), text)


# -- tables ------------------------------------------------------------------------------------


def _num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns as kubectl prints them: upper-case headers, left-aligned, three spaces apart."""
    cells = [list(headers), *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells) + "\n"


def _warnings(body: dict[str, Any]) -> str:
    return "".join(f"Warning: {w.get('code')}: {w.get('message')}\n" for w in body.get("warnings") or ())


def gpu_table(body: dict[str, Any]) -> str:
    project = body.get("project") or {}
    department = body.get("department") or {}
    pods = body.get("pod_gpus") or {}
    row = [
        body.get("namespace"),
        body.get("status"),
        department.get("name") or "-",
        _num(project.get("quota")) if project else "-",
        _num(project.get("allocated")) if project else "-",
        _num(body.get("available_non_preemptible")),
        _num(body.get("available_preemptible")),
        _num(pods.get("non_preemptible")),
        _num(pods.get("preemptible")),
    ]
    headers = ["PROJECT", "STATUS", "DEPARTMENT", "DESERVED", "ALLOCATED", "AVAILABLE", "AVAILABLE-PREEMPTIBLE",
               "PODS-NON-PREEMPTIBLE", "PODS-PREEMPTIBLE"]  # fmt: skip
    return table(headers, [row]) + _warnings(body)


def scheduling_table(body: dict[str, Any]) -> str:
    def labels(part: dict[str, Any] | None) -> list[str]:
        part = part or {}
        return [", ".join(part.get("choices") or ()) or "-", ", ".join(part.get("default") or ()) or "-",
                str(part.get("level") or "-")]  # fmt: skip

    rows = [["affinity", *labels(body.get("affinity"))], ["anti-affinity", *labels(body.get("anti_affinity"))]]
    priority = body.get("priority_class") or {}
    rows.append([
        "priority-class",
        ", ".join(c.get("name", "") for c in priority.get("choices") or ()) or "-",
        priority.get("default") or "-",
        str(priority.get("level") or "-"),
    ])  # fmt: skip
    queue = body.get("queue")
    if queue:
        rows.append(["queue", ", ".join(queue.get("choices") or ()) or "-", queue.get("default") or "-",
                     str(queue.get("level") or "-")])  # fmt: skip
    topology = body.get("topology")
    if topology:
        rows.append([
            "topology",
            ", ".join(c.get("name", "") for c in topology.get("choices") or ()) or "-",
            topology.get("default") or "-",
            str(topology.get("level") or "-"),
        ])  # fmt: skip
    gpus = body.get("gpus") or {}
    rows.append(["gpus", "allowed" if gpus.get("allowed") else "refused", _num(gpus.get("available_non_preemptible")),
                 gpus.get("reason") or "-"])  # fmt: skip
    notes = "".join(f"Note: {n}\n" for n in body.get("notes") or ())
    return table(["CHOICE", "MAY CHOOSE", "DEFAULT", "SET BY"], rows) + notes


def admin_table(body: dict[str, Any]) -> str:
    rows = [
        [p.get("namespace"), p.get("department"), "yes" if p.get("linked") else "no", p.get("runai_project") or "-",
         p.get("runai_department") or "-", _num(p.get("quota")), _num(p.get("allocated")),
         ", ".join(w.get("code", "") for w in p.get("warnings") or ()) or "-"]
        for p in body.get("projects") or ()
    ]  # fmt: skip
    head = f"Run:ai: {body.get('status')}; default department: {body.get('default_department')}\n"
    headers = ["PROJECT", "DEPARTMENT", "LINKED", "RUNAI-PROJECT", "RUNAI-DEPARTMENT", "DESERVED", "ALLOCATED",
               "WARNINGS"]  # fmt: skip
    return head + table(headers, rows) + _warnings(body)


def move_text(body: dict[str, Any]) -> str:
    lines = [str(body.get("message") or "")]
    for moved in body.get("moved") or ():
        lines.append(f"  {'would move' if moved.get('dry_run') else 'moved'}: {moved.get('namespace')} "
                     f"({moved.get('outcome')})")  # fmt: skip
    failed = body.get("failed")
    if failed:
        lines.append(f"  stopped at: {failed.get('namespace')}: {failed.get('reason')}")
    if body.get("remaining"):
        lines.append("  remaining: " + ", ".join(body["remaining"]))
    if body.get("drift"):
        lines.append("  the GPU view reports RUN_AI_DEPARTMENT_DRIFT until a Run:ai administrator moves the project")
    if body.get("reminder"):
        lines.append(f"REMINDER: {body['reminder']}")
    return "\n".join(lines) + "\n"


# -- commands ----------------------------------------------------------------------------------


def _show(answer: Answer, output: str, as_table: Callable[[dict[str, Any]], str], out: TextIO, err: TextIO) -> int:
    """Print an answer as asked; the exit code from its status."""
    body = answer.body
    if 200 <= answer.status < 300 and isinstance(body, dict):
        if output == "json":
            out.write(json.dumps(body, indent=2) + "\n")
        elif output == "yaml":
            out.write(yaml.safe_dump(body, sort_keys=False))
        else:
            out.write(as_table(body))
        return EXIT_OK
    return _refusal(answer, output, out, err)


def _refusal(answer: Answer, output: str, out: TextIO, err: TextIO) -> int:
    body = answer.body
    message = body.get("error") or body.get("message") if isinstance(body, dict) else str(body).strip()
    # The apiserver's Status says its reason in `reason` (its `code` is the HTTP status); the
    # server's own errors in `code`.
    code = ""
    if isinstance(body, dict):
        code = str(body.get("reason") if body.get("kind") == "Status" else body.get("code") or "")
    if isinstance(body, dict) and output in ("json", "yaml") and answer.status in (403, 409):
        # A refusal's object is an answer too (e.g. the pods that stop a move): printed as asked.
        out.write(json.dumps(body, indent=2) + "\n" if output == "json" else yaml.safe_dump(body, sort_keys=False))
    hint = ""
    if answer.status == 404 and isinstance(body, dict) and body.get("kind") == "Status":
        hint = (" (is the scheduling-webhook chart installed with aggregatedApi.enabled? "
                "`kubectl get apiservice v1.scheduling.hopsworks.ai`)")  # fmt: skip
    if answer.status == 503 and isinstance(body, dict) and body.get("kind") == "Status":
        hint = (
            " (the apiserver cannot reach the scheduling-webhook server: "
            "`kubectl get apiservice v1.scheduling.hopsworks.ai`)"
        )
    err.write(f"Error from server ({code or answer.status}): {message}{hint}\n")
    if isinstance(body, dict) and body.get("pods"):
        err.write("pods running or waiting: " + ", ".join(body["pods"]) + "\n")
    if isinstance(body, dict) and answer.status in (409,) and body.get("result"):
        err.write(move_text(body["result"]))
    # Refused: RBAC (401, 403) or the server's refusal of the action (409). Else bad input or no answer.
    return EXIT_REFUSED if answer.status in (401, 403, 409) else EXIT_BAD_INPUT


def _dry_run(value: str) -> list[tuple[str, str]]:
    if value == "server":
        return [("dryRun", "All")]
    if value == "none":
        return []
    raise PluginError(f"--dry-run={value}: only server or none (only the server can tell what a move would do)")


async def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    kubeconfig, context = args.kubeconfig, args.context

    def namespace() -> str:
        return str(args.namespace or context_namespace(kubeconfig, context))

    if args.subcommand == "gpu":
        ns = namespace()
        answer = await call(kubeconfig, context, "GET", f"{PREFIX}/namespaces/{quote(ns, safe='')}/projectviews/gpu")
        return _show(answer, args.output, gpu_table, out, err)
    if args.subcommand == "scheduling":
        ns = namespace()
        query = [("kind", args.kind)] if args.kind else []
        path = f"{PREFIX}/namespaces/{quote(ns, safe='')}/projectviews/scheduling"
        return _show(await call(kubeconfig, context, "GET", path, query=query), args.output, scheduling_table, out, err)
    if args.subcommand == "admin":
        answer = await call(kubeconfig, context, "GET", f"{PREFIX}/adminviews/runai")
        return _show(answer, args.output, admin_table, out, err)
    if args.subcommand == "move":
        path = f"{PREFIX}/namespaces/{quote(args.project, safe='')}/projectmoves"
        body = {"department": args.department or None}
        answer = await call(kubeconfig, context, "POST", path, query=_dry_run(args.dry_run), body=body)
        return _show(answer, args.output, move_text, out, err)
    if args.subcommand == "delete-department":
        path = f"{PREFIX}/departments/{quote(args.department, safe='')}"
        answer = await call(kubeconfig, context, "DELETE", path, query=_dry_run(args.dry_run))
        return _show(answer, args.output, move_text, out, err)
    raise PluginError(f"unknown command {args.subcommand!r}")


def _common(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # Accepted before and after the command, as kubectl's global flags are.
    default = None if top else argparse.SUPPRESS
    parser.add_argument("--kubeconfig", default=default, help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    parser.add_argument("--context", default=default, help="the kubeconfig context (default: its current one)")
    parser.add_argument("-n", "--namespace", default=default, help="the project namespace (default: the context's)")
    parser.add_argument("-o", "--output", default="table" if top else argparse.SUPPRESS, choices=OUTPUTS,
                        help="table (default), or the API's object as json or yaml")  # fmt: skip


def add_commands(parser: argparse.ArgumentParser, formatter: type[argparse.HelpFormatter]) -> None:
    """The plugin's commands, on `parser` (kubectl-hopsworks, and `scheduling-webhook admin`)."""
    _common(parser, top=True)
    sub = parser.add_subparsers(dest="subcommand", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, formatter_class=formatter)
        _common(p, top=False)
        return p

    command("gpu", "the GPU view of a project: deserved, allocated and available GPUs")
    scheduling = command("scheduling", "what a project's workloads may choose, and their defaults")
    scheduling.add_argument("--kind", default=None, help="the workload kind, e.g. notebook or job")
    admin = command("admin", "the Run:ai admin view: every department and project")
    admin.add_argument("view", choices=("runai",), help="the view (runai)")
    for name, help in (
        ("move", "move a project to another department (its Run:ai project too)"),
        ("delete-department", "move a department's projects to the default department"),
    ):
        p = command(name, help)
        if name == "move":
            p.add_argument("project", help="the project namespace")
            p.add_argument("--department", required=True, help="the department ('' for the default one)")
        else:
            p.add_argument("department", help="the department")
        p.add_argument(
            "--dry-run",
            nargs="?",
            const="server",
            default="none",
            choices=("none", "server"),
            help="server: the server checks everything and says what would change, and changes nothing",
        )
    review = command("review", "offline: decide on a Pod or AdmissionReview file, as the server would")
    review.add_argument("-f", "--filename", required=True, help="YAML or JSON file, or - for stdin")
    review.add_argument("--state", required=True, help="a folder of Kubernetes YAML, e.g. examples/cluster")
    review.add_argument("--install-namespace", default="hopsworks", help="where the settings live in --state")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kubectl hopsworks",
        description="The scheduling webhook's views and admin actions through the apiserver, as the kubeconfig's user.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_commands(parser, argparse.ArgumentDefaultsHelpFormatter)
    return parser


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run parsed arguments; the exit code. `out` and `err`: sys.stdout and sys.stderr as they are
    at the call."""
    out = out or sys.stdout
    err = err or sys.stderr
    if args.subcommand == "review":
        from webhook.review import review_command

        output = "text" if args.output == "table" else args.output
        review_args = argparse.Namespace(
            file=args.filename, state=args.state, namespace=args.install_namespace, output=output
        )
        return review_command(review_args, out)
    try:
        return asyncio.run(_run(args, out, err))
    except PluginError as exc:
        err.write(f"error: {exc}\n")
        return EXIT_BAD_INPUT


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
