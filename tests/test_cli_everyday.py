"""What people expect of the command line and the log: a version, output a script can parse, log
options where they are typed, shell completion, JSON log lines, and a stop that says what it does."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.https import LOOPBACK, free_port, make_cert_files
from webhook.cli import build_parser
from webhook.core.decision import Decision
from webhook.http.handlers import logging_review_uid
from webhook.logformat import JsonFormatter

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "examples" / "cluster"
REQUESTS = ROOT / "examples" / "requests"
BIN = Path(sys.executable).parent


def run_cli(*argv: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "scheduling-webhook"), *argv], capture_output=True, text=True, timeout=60, check=False, **kw
    )


def test_version_as_an_option_and_as_a_command() -> None:
    expected = f"scheduling-webhook {version('scheduling-webhook')}\n"
    assert run_cli("--version").stdout == expected
    assert run_cli("version").stdout == expected


def test_log_options_are_taken_before_and_after_the_subcommand() -> None:
    parse = build_parser().parse_args
    review = ["review", "pod.yaml", "--state", "x"]
    assert (parse(review).log_level, parse(review).log_format) == ("INFO", "text")
    assert parse(["--log-level", "error", *review]).log_level == "ERROR"
    after = parse([*review, "--log-level", "debug", "--log-format", "json"])
    assert (after.log_level, after.log_format) == ("DEBUG", "json")
    assert parse(["--log-level", "error", *review, "--log-level", "debug"]).log_level == "DEBUG"


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_review_output_is_one_document_a_script_reads(output: str) -> None:
    allowed = run_cli("review", str(REQUESTS / "notebook-pod.yaml"), "--state", str(CLUSTER), "-o", output)
    assert allowed.returncode == 0, allowed.stderr
    answer = json.loads(allowed.stdout) if output == "json" else yaml.safe_load(allowed.stdout)
    assert answer["allowed"] is True and answer["patchType"] == "JSONPatch"
    assert {"op": "add", "path": "/spec/priorityClassName", "value": "hopsworks-normal"} in answer["patch"]
    assert answer["object"]["spec"]["priorityClassName"] == "hopsworks-normal"
    refused = run_cli("review", str(REQUESTS / "refused-priority.json"), "--state", str(CLUSTER), "-o", output)
    assert refused.returncode == 1
    answer = json.loads(refused.stdout) if output == "json" else yaml.safe_load(refused.stdout)
    assert answer["allowed"] is False and answer["status"]["code"] == 403 and "object" not in answer


def complete(script: str, *words: str) -> list[str]:
    """What bash offers after `words` (the last one being typed), with the generated script loaded."""
    line = " ".join(f"'{w}'" for w in words)
    call = f'COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; _scheduling_webhook; printf "%s\\n" "${{COMPREPLY[@]}}"'
    probe = f"{script}\n{call}"
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.split()


def test_bash_completion_offers_subcommands_options_and_choices() -> None:
    script = run_cli("completion", "bash").stdout
    assert "complete -o default -F _scheduling_webhook scheduling-webhook" in script
    assert complete(script, "scheduling-webhook", "re") == ["review"]
    assert set(complete(script, "scheduling-webhook", "admin", "")) >= {"move-project", "delete-department"}
    assert complete(script, "scheduling-webhook", "review", "pod.yaml", "-o", "") == ["text", "json", "yaml"]
    assert complete(script, "scheduling-webhook", "--log-level", "INFO", "serve", "--st") == ["--state"]
    assert "bashcompinit" in run_cli("completion", "zsh").stdout


def test_json_log_lines_carry_the_review_uid_while_it_is_decided() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tests.uid")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)

    async def decide(request: Any) -> Decision:
        logger.info("deciding\nforged line")
        return Decision.allow()

    import asyncio

    try:
        asyncio.run(logging_review_uid(decide)({"uid": "7d3f-uid"}))
        logger.info("after")
    finally:
        logger.removeHandler(handler)
    during, after = (json.loads(line) for line in stream.getvalue().splitlines())
    assert during["uid"] == "7d3f-uid" and during["message"] == "deciding\nforged line"
    assert during["level"] == "INFO" and during["logger"] == "tests.uid" and during["time"].endswith("+00:00")
    assert "uid" not in after


def test_serve_logs_json_and_says_when_draining_starts_and_ends(tmp_path: Path) -> None:
    certs = make_cert_files(tmp_path / "certs")
    port = free_port()
    argv = ["serve", "--state", str(CLUSTER), "--certs", str(certs.dir), "--host", LOOPBACK, "--port", str(port)]
    log = tmp_path / "serve.log"
    env = {**os.environ, "WEBHOOK_DRAIN_SECONDS": "0.2"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(BIN / "scheduling-webhook"), *argv, "--log-format", "json"], stderr=out, stdout=out, env=env
        )
    try:
        deadline = time.monotonic() + 30
        while "console on" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert all({"time", "level", "logger", "message"} <= line.keys() for line in lines), lines
    messages = [line["message"] for line in lines]
    assert f"console on https://localhost:{port}/ui/" in messages
    draining = next(i for i, m in enumerate(messages) if m.startswith("draining: /readyz answers 503"))
    assert any(m.startswith("drained and stopped in ") for m in messages[draining + 1 :]), messages
