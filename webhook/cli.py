"""`scheduling-webhook` command line: serve, certs, manifests, review, admin."""

from __future__ import annotations

import argparse
import logging
import os
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scheduling-webhook", description=__doc__)
    parser.add_argument("--log-level", default="INFO")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the admission server")
    serve.add_argument("--state", help="a folder of Kubernetes YAML to use instead of an API server")
    serve.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster, then $KUBECONFIG)")
    serve.add_argument("--certs", default="certs", help="folder with tls.crt, tls.key (and ca.crt)")
    serve.add_argument("--host", default="0.0.0.0")
    serve.add_argument("--port", type=int, default=8443)
    serve.add_argument(
        "--probe-port",
        type=int,
        default=0,
        help="also serve /healthz, /readyz and /metrics here, over TLS without a client certificate "
        "(kubelet probes send none); 0: only on --port",
    )
    serve.add_argument("--namespace", default=None, help="install namespace (default: $POD_NAMESPACE)")
    serve.add_argument("--client-ca", default=None, help="verify client certificates against this CA")
    serve.add_argument("--runai-secret-dir", default=None, help="where the Run:ai client secret is mounted")
    serve.add_argument(
        "--installer",
        action="append",
        default=[],
        help="identity allowed to change run_ai_enable: a username, or group:NAME (repeatable; "
        "also $SCHEDULING_WEBHOOK_INSTALLERS, comma-separated)",
    )
    serve.add_argument(
        "--service-account",
        default="scheduling-webhook",
        help="this server's own ServiceAccount name, also $SERVICE_ACCOUNT_NAME (its namespace edits are its own)",
    )

    certs = sub.add_parser("certs", help="make a CA and a serving certificate")
    certs.add_argument("--out", default="certs")
    certs.add_argument("--service", default="scheduling-webhook")
    certs.add_argument("--namespace", default="hopsworks")
    certs.add_argument("--hostname", action="append", default=[], help="extra DNS name (repeatable)")
    certs.add_argument("--ip", action="append", default=[], help="extra IP address (repeatable)")
    certs.add_argument("--days", type=int, default=365)
    certs.add_argument("--new-ca", action="store_true", help="make a new CA even when one exists")

    manifests = sub.add_parser("manifests", help="render manifests/ with a values file")
    manifests.add_argument("--values", default=None)
    manifests.add_argument("--out", default=None, help="write here instead of stdout")

    review = sub.add_parser("review", help="offline: decide on a Pod or AdmissionReview file")
    review.add_argument("file")
    review.add_argument("--state", required=True)
    review.add_argument("--namespace", default="hopsworks")

    admin = sub.add_parser("admin", help="administrator actions against a running server")
    admin_sub = admin.add_subparsers(dest="action", required=True)
    move = admin_sub.add_parser("move-project")
    move.add_argument("namespace")
    move.add_argument("department")
    delete = admin_sub.add_parser("delete-department")
    delete.add_argument("name")
    for p in (move, delete):
        p.add_argument("--server", default="https://127.0.0.1:8443")
        p.add_argument("--ca", default="certs/ca.crt")
        p.add_argument("--token", default=None, help="bearer token (default: $KUBE_TOKEN)")
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(argv)
    except BrokenPipeError:
        # `review ... | head`: the reader left; say nothing more (and keep the interpreter from
        # complaining while it flushes stdout on exit).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )
    if args.command == "serve":
        from webhook.app import run_server

        return run_server(args)
    if args.command == "certs":
        from webhook.tls import certs_command

        return certs_command(args)
    if args.command == "manifests":
        from webhook.manifests import manifests_command

        return manifests_command(args)
    if args.command == "review":
        from webhook.review import review_command

        return review_command(args)
    if args.command == "admin":
        from webhook.admin_cli import admin_command

        return admin_command(args)
    return 2
