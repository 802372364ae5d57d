"""`scheduling-webhook` command line: serve, certs, console-keys, review, admin, uninstall-cleanup,
version, completion."""

from __future__ import annotations

import argparse
import os
import sys
from importlib.metadata import PackageNotFoundError, version

from webhook.logformat import LOG_FORMATS, configure_logging


class HELP(argparse.ArgumentDefaultsHelpFormatter):
    """Shows a default in --help unless there is none or the help text already says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, [], False, argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
# What a shell reports for a process killed by SIGPIPE (128 + 13).
EXIT_PIPE_CLOSED = 141


def package_version() -> str:
    try:
        return version("scheduling-webhook")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _logging_options(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument("--log-level", default=default, type=str.upper, choices=LOG_LEVELS, help="log verbosity")
    parser.add_argument(
        "--log-format",
        default=default,
        choices=LOG_FORMATS,
        help="text lines, or one JSON object per line (time, level, logger, message, and the review's uid)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scheduling-webhook", description=__doc__, formatter_class=HELP)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    parser.set_defaults(log_level="INFO", log_format="text")
    _logging_options(parser, argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=help, description=help, formatter_class=HELP)
        # Also after the subcommand, where people put it; there it wins over one given before.
        _logging_options(parser, argparse.SUPPRESS)
        return parser

    serve = command("serve", "run the admission server")
    serve.add_argument("--state", default=None, help="a folder of Kubernetes YAML to use instead of an API server")
    serve.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    serve.add_argument("--certs", default="certs/dev", help="folder with tls.crt, tls.key (and ca.crt)")
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on")
    serve.add_argument("--port", type=int, default=8443, help="HTTPS port (webhooks, APIs, probes, /metrics)")
    serve.add_argument(
        "--probe-port",
        type=int,
        default=0,
        help="also serve /healthz, /readyz and /metrics here, over TLS without a client certificate "
        "(kubelet probes send none); 0: only on --port",
    )
    serve.add_argument(
        "--admission-port",
        type=int,
        default=None,
        help="serve the admission webhooks (/mutate/*, /validate/*) here and only here; --client-ca and "
        "--client-name then apply to this port alone, and --port keeps the console and the APIs "
        "(default: the webhooks on --port with everything else)",
    )
    serve.add_argument(
        "--aggregated-port",
        type=int,
        default=None,
        help="serve the aggregated API (scheduling.hopsworks.ai/v1, reached through the apiserver by "
        "`kubectl hopsworks`) here; it requires the apiserver's front-proxy client certificate, read from "
        "kube-system/extension-apiserver-authentication (cluster mode only; default: not served)",
    )
    serve.add_argument(
        "--reuse-port",
        action="store_true",
        help="let other processes listen on the same address and port (SO_REUSEPORT): the kernel spreads "
        "new connections over them",
    )
    serve.add_argument("--namespace", default=None, help="install namespace (default: $POD_NAMESPACE)")
    serve.add_argument(
        "--client-ca",
        default=None,
        help="require a client certificate from this CA on the admission port (on --port without --admission-port)",
    )
    serve.add_argument(
        "--client-name",
        action="append",
        default=[],
        help="with --client-ca: admit only client certificates naming this (common name or DNS name; repeatable)",
    )
    serve.add_argument("--runai-secret-dir", default=None, help="where the Run:ai client secret is mounted")
    serve.add_argument(
        "--console-keys",
        default=None,
        help="the console's session key file, as `console-keys` writes it (without: a key of this process only)",
    )
    serve.add_argument(
        "--installer",
        action="append",
        default=[],
        help="identity allowed to change run_ai_enable: a username, or group:NAME (repeatable; "
        "also $SCHEDULING_WEBHOOK_INSTALLERS, comma-separated)",
    )
    serve.add_argument(
        "--pod-grouper",
        action="append",
        default=[],
        help="identity of KAI's pod grouper, which may set a pod's pod-group-name annotation: a username, or "
        "group:NAME (repeatable; also $SCHEDULING_WEBHOOK_POD_GROUPERS, comma-separated)",
    )
    serve.add_argument(
        "--service-account",
        default="scheduling-webhook",
        help="this server's own ServiceAccount name, also $SERVICE_ACCOUNT_NAME (its namespace edits are its own)",
    )

    certs = command("certs", "make a CA (kept if one exists) and a serving certificate")
    certs.add_argument(
        "--out", default="certs/cluster", help="folder for ca.crt, ca.key, tls.crt, tls.key (make run uses certs/dev)"
    )
    certs.add_argument("--service", default="scheduling-webhook", help="the Service the apiserver calls")
    certs.add_argument("--namespace", default="hopsworks", help="the Service's namespace")
    certs.add_argument("--hostname", action="append", default=[], help="extra DNS name (repeatable)")
    certs.add_argument("--ip", action="append", default=[], help="extra IP address (repeatable)")
    certs.add_argument("--days", type=int, default=365, help="serving certificate lifetime")
    certs.add_argument("--new-ca", action="store_true", help="make a new CA even when one exists")
    certs.add_argument(
        "--keep-valid",
        action="store_true",
        help="keep tls.crt when the CA signed it, it names every name asked for and has 30+ days left",
    )

    keys = command(
        "console-keys",
        "write the console's session key file, or rotate it: a new key sealing after --activate-in, "
        "keys nothing valid is sealed with dropped",
    )
    keys.add_argument("--file", default="certs/cluster/console-session-keys", help="the key file (0600)")
    # The kubelet updates a mounted Secret within its sync period (a minute) plus its cache's; five
    # minutes leave room for both on every node before any replica seals with the new key.
    keys.add_argument(
        "--activate-in",
        type=int,
        default=300,
        help="seconds until the new key seals: longer than the kubelet takes to update every replica's mount",
    )
    keys.add_argument(
        "--replace", action="store_true", help="one new key at once and nothing else: signs every user out"
    )

    cleanup = command(
        "uninstall-cleanup",
        "after the chart's objects are gone (its uninstall Job): take this system's finalizer, label and "
        "annotations off the namespaces carrying them, delete its reservation ConfigMaps and Lease",
    )
    cleanup.add_argument("--namespace", default=None, help="install namespace (default: $POD_NAMESPACE)")
    cleanup.add_argument("--wait-s", type=float, default=120, help="how long to wait for the server's pods to end")
    cleanup.add_argument(
        "--guard-policy",
        default="",
        help="a ValidatingAdmissionPolicy that must be refusing this identity's other namespace edits before "
        "any namespace is patched (the chart's uninstall Job names its own); empty: do not wait for one",
    )

    review = command(
        "review",
        "offline: decide on a Pod or AdmissionReview file; exit 0 allowed, 1 refused, 2 bad input, "
        f"{EXIT_PIPE_CLOSED} when the reader of stdout went away",
    )
    review.add_argument("file", help="YAML or JSON file, or - for stdin")
    review.add_argument("--state", required=True, help="a folder of Kubernetes YAML, e.g. examples/cluster")
    review.add_argument("--namespace", default="hopsworks", help="install namespace (where the settings live)")
    review.add_argument(
        "-o",
        "--output",
        default="text",
        choices=("text", "json", "yaml"),
        help="text for people; json or yaml: one object, the AdmissionReview response with its patch "
        "decoded and the patched object",
    )

    command("version", "print the version")
    completion = command(
        "completion", "print a shell completion script: eval it, or save it where the shell loads them"
    )
    completion.add_argument("shell", choices=("bash", "zsh"), help="the shell")

    admin = command(
        "admin",
        "administrator actions through the apiserver, as the kubeconfig's user (as `kubectl hopsworks`)",
    )
    admin_sub = admin.add_subparsers(dest="action", required=True)
    move = admin_sub.add_parser(
        "move-project", help="move a project to another Run:ai department", formatter_class=HELP
    )
    move.add_argument("namespace", help="the project namespace")
    move.add_argument("department", help="the Run:ai department")
    delete = admin_sub.add_parser(
        "delete-department",
        help="move a department's projects to the default one, then delete it",
        formatter_class=HELP,
    )
    delete.add_argument("name", help="the Run:ai department")
    for p in (move, delete):
        p.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
        p.add_argument("--context", default=None, help="the kubeconfig context (default: its current one)")
        p.add_argument(
            "--dry-run",
            nargs="?",
            const="server",
            default="none",
            choices=("none", "server"),
            help="server: the server checks everything and says what would change, and changes nothing",
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(argv)
    except BrokenPipeError:
        # `review ... | head`: the reader left; say nothing more (and keep the interpreter from
        # complaining while it flushes stdout on exit). Not 1: that is a refusal.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_PIPE_CLOSED


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level, args.log_format)
    if args.command == "version":
        print(f"scheduling-webhook {package_version()}")
        return 0
    if args.command == "completion":
        from webhook.completion import completion_script

        print(completion_script(parser, args.shell), end="")
        return 0
    if args.command == "serve":
        from webhook.runtime import run_server

        return run_server(args)
    if args.command == "certs":
        from webhook.certs_cli import certs_command

        return certs_command(args)
    if args.command == "console-keys":
        from webhook.console.keys_cli import console_keys_command

        return console_keys_command(args)
    if args.command == "uninstall-cleanup":
        from webhook.uninstall_cli import uninstall_cleanup_command

        return uninstall_cleanup_command(args)
    if args.command == "review":
        from webhook.review import review_command

        return review_command(args)
    if args.command == "admin":
        from webhook.kubectl_plugin import run as run_plugin

        # The kubectl plugin's move and delete-department, under their older names here.
        plugin_args = argparse.Namespace(
            subcommand="move" if args.action == "move-project" else "delete-department",
            project=getattr(args, "namespace", None),
            department=args.department if args.action == "move-project" else args.name,
            kubeconfig=args.kubeconfig,
            context=args.context,
            namespace=None,
            output="table",
            dry_run=args.dry_run,
        )
        return run_plugin(plugin_args)
    return 2
