"""`scheduling-webhook admin ...`: call the admin API of a running server over HTTPS.

Exit codes: 0 done, 1 the server refused or the action failed (the answer says why), 2 the server
could not be reached or answered something unreadable, runs in folder mode (no admin API), or no
token was given.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import sys
from typing import Any, TextIO
from urllib.parse import quote

import aiohttp

from webhook.http.admin_api import DELETE_DEPARTMENT_PATH, MOVE_PATH
from webhook.http.app import CLUSTER_MODE_ONLY

TIMEOUT_S = 120.0  # a department delete moves projects one at a time


def _request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None]:
    if args.action == "move-project":
        path = MOVE_PATH.format(namespace=quote(args.namespace, safe=""))
        return "POST", path, {"department": args.department}
    if args.action == "delete-department":
        return "DELETE", DELETE_DEPARTMENT_PATH.format(name=quote(args.name, safe="")), None
    raise ValueError(f"unknown admin action {args.action!r}")


async def _call(
    server: str, server_name: str | None, ca: str | None, token: str, method: str, path: str, body: Any
) -> tuple[int, Any]:
    ctx = ssl.create_default_context(cafile=ca) if ca else ssl.create_default_context()
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.request(
            method, server.rstrip("/") + path, json=body, headers=headers, ssl=ctx, server_hostname=server_name
        ) as resp,
    ):
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


def _print_answer(status: int, answer: Any, out: TextIO) -> None:
    if not isinstance(answer, dict):
        print(f"HTTP {status}: {answer}", file=out)
        return
    if "error" in answer:
        print(f"error ({status} {answer.get('code', '')}): {answer['error']}", file=out)
        if answer.get("pods"):
            print("pods running or waiting: " + ", ".join(answer["pods"]), file=out)
    elif "message" in answer:
        print(answer["message"], file=out)
    for moved in answer.get("moved") or ():
        print(f"  moved: {moved['namespace']} ({moved['outcome']})", file=out)
    failed = answer.get("failed")
    if failed:
        print(f"  stopped at: {failed['namespace']}: {failed['reason']}", file=out)
    if answer.get("remaining"):
        print("  remaining: " + ", ".join(answer["remaining"]), file=out)
    if answer.get("drift"):
        print("  the GPU view reports RUN_AI_DEPARTMENT_DRIFT until a Run:ai administrator moves the project", file=out)
    if answer.get("reminder"):
        print(f"REMINDER: {answer['reminder']}", file=out)


def admin_command(args: argparse.Namespace) -> int:
    token = args.token or os.environ.get("KUBE_TOKEN")
    if not token:
        print("no token: pass --token or set $KUBE_TOKEN", file=sys.stderr)
        return 2
    method, path, body = _request(args)
    ca = args.ca if args.ca and os.path.exists(args.ca) else None
    if args.ca and ca is None:
        print(f"CA file {args.ca} not found", file=sys.stderr)
        return 2
    try:
        status, answer = asyncio.run(_call(args.server, args.server_name, ca, token, method, path, body))
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        print(f"cannot reach {args.server}: {exc}", file=sys.stderr)
        return 2
    if status == 404 and isinstance(answer, dict) and answer.get("code") == CLUSTER_MODE_ONLY:
        print(f"{args.server}: {answer['error']}", file=sys.stderr)
        return 2
    ok = 200 <= status < 300
    _print_answer(status, answer, sys.stdout if ok else sys.stderr)
    if not isinstance(answer, dict):
        return 2
    return 0 if ok else 1
