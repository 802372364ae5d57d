"""The README's command blocks, run as written, print what the README shows.

`make run` is run through the Makefile (on a free port: `PORT=` is how the README says to choose
one), and every ```bash block of "Ask it something" runs with bash in a folder laid out like a
clone beside it; the block after each (```json or ```text) is what it must print. There `…` stands
for text cut short: inside a JSON string it ends a prefix, inside a line it matches anything on
that line, and on a line of its own any number of lines. Which blocks are run elsewhere, and the one
that is not run at all, is said below, so a block added to the README without a test fails here.
"""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.https import free_port

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
VENV = Path(sys.prefix)
ELLIPSIS = "…"

# Blocks run by other tests: the Install section's local steps by tests/test_docs.py, its helm
# commands against a real control plane by tests/e2e/test_chart_lifecycle.py.
RUN_ELSEWHERE = ("cp examples/values.example.yaml my-values.yaml",)
# `make test` is the whole suite: a test cannot run the suite it is part of.
NOT_RUN = ("make test",)


def fenced_blocks(text: str) -> list[tuple[str, str, str]]:
    """(language, body, section heading) of every fenced block, in order."""
    blocks = []
    heading = ""
    for match in re.finditer(r"^(#{2,3} [^\n]*)$|^```(\w*)\n(.*?)^```$", text, re.MULTILINE | re.DOTALL):
        if match.group(1):
            heading = match.group(1)
        else:
            blocks.append((match.group(2), match.group(3), heading))
    return blocks


def command_blocks() -> list[tuple[str, str | None, str | None]]:
    """(bash block, language of the block after it, that block) for every ```bash block."""
    blocks = fenced_blocks(README)
    found = []
    for i, (language, body, _) in enumerate(blocks):
        if language != "bash":
            continue
        following = blocks[i + 1] if i + 1 < len(blocks) else None
        if following is not None and following[0] in ("json", "text"):
            found.append((body, following[0], following[1]))
        else:
            found.append((body, None, None))
    return found


def matches(expected: Any, actual: Any) -> bool:
    if isinstance(expected, dict):
        return (
            isinstance(actual, dict)
            and expected.keys() == actual.keys()
            and all(matches(v, actual[k]) for k, v in expected.items())
        )
    if isinstance(expected, list):
        return isinstance(actual, list) and len(expected) == len(actual) and all(map(matches, expected, actual))
    if isinstance(expected, str) and expected.endswith(ELLIPSIS):
        return isinstance(actual, str) and actual.startswith(expected[: -len(ELLIPSIS)])
    return bool(expected == actual)


def text_pattern(expected: str) -> re.Pattern[str]:
    parts = []
    for line in expected.splitlines():
        if line == ELLIPSIS:
            parts.append(r"(?:.*\n)*?")
        else:
            parts.append(".*?".join(map(re.escape, line.split(ELLIPSIS))) + r"\n")
    return re.compile("".join(parts))


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder laid out like a clone after `make run`'s install: examples/ and .venv/."""
    folder = tmp_path_factory.mktemp("clone")
    (folder / "examples").symlink_to(ROOT / "examples")
    (folder / ".venv").symlink_to(VENV)
    return folder


def make(*args: str, **kwargs: Any) -> list[str]:
    """make in the repository with the venv running these tests, which is never reinstalled from
    inside a test (`-o`: its stamps count as up to date)."""
    stamps = [f"-o{VENV / '.installed'}", f"-o{VENV / '.installed-run'}"]
    return ["make", "--no-print-directory", "-C", str(ROOT), *stamps, f"VENV={VENV}", f"PYTHON={sys.executable}", *args]


@pytest.fixture(scope="module")
def make_run(clone: Path) -> Iterator[tuple[int, Path]]:
    """`make run PORT=...`, its certificates in the clone; (port, its log) once it says where the
    console is."""
    port = free_port()
    log = clone / "make-run.log"
    argv = make("run", f"PORT={port}", f"DEV_CERTS={clone / 'certs' / 'dev'}", f"STATE={ROOT / 'examples' / 'cluster'}")
    with log.open("wb") as out:
        # A session of its own: make and the server it starts stop together.
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while f"console on https://localhost:{port}/ui/" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield port, log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_every_command_block_is_accounted_for() -> None:
    for body, language, _ in command_blocks():
        runs_here = language is not None or body.startswith("make run ")
        assert runs_here or body.startswith(RUN_ELSEWHERE), body


def test_make_run_says_where_the_console_is_and_the_root_leads_there(make_run: tuple[int, Path], clone: Path) -> None:
    port, log = make_run
    two = next(body for body, _, _ in command_blocks() if body.startswith("make run"))
    assert [line.split("#")[0].strip() for line in two.splitlines()] == ["make run", *NOT_RUN]
    assert log.read_text().count("console on https://") == 1
    context = ssl.create_default_context(cafile=str(clone / "certs" / "dev" / "ca.crt"))
    opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=context), NoRedirect)
    with pytest.raises(urllib.error.HTTPError) as redirected:
        opener.open(f"https://localhost:{port}/", timeout=5)
    assert redirected.value.code == 303 and redirected.value.headers["Location"] == "/ui/"
    with opener.open(f"https://localhost:{port}/ui/", timeout=5) as page:
        assert page.status == 200 and "text/html" in page.headers["Content-Type"]


@pytest.mark.parametrize("index", [i for i, (_, lang, _) in enumerate(command_blocks()) if lang is not None])
def test_a_command_block_prints_what_the_readme_shows(make_run: tuple[int, Path], clone: Path, index: int) -> None:
    port, _ = make_run
    body, language, shown = command_blocks()[index]
    assert shown is not None
    script = body.replace("https://localhost:8443/", f"https://localhost:{port}/")
    done = subprocess.run(["bash", "-c", script], cwd=clone, capture_output=True, text=True, timeout=60, check=False)
    assert not done.stderr, done.stderr
    if language == "json":
        assert matches(json.loads(shown), json.loads(done.stdout)), (shown, done.stdout)
    else:
        assert text_pattern(shown).fullmatch(done.stdout), (shown, done.stdout)


def test_make_run_installs_what_running_needs_and_make_test_the_rest(tmp_path: Path) -> None:
    """What each target would run for a fresh clone (`make -n`): the package alone for `make run`,
    the test extras only on top for `make test`; the editable install's banner filtered."""
    fresh = ["make", "-n", "--no-print-directory", "-C", str(ROOT), f"VENV={tmp_path / 'venv'}"]
    run = subprocess.run([*fresh, "run"], capture_output=True, text=True, timeout=60, check=True).stdout
    installs = [line for line in run.splitlines() if " install " in line and "--upgrade pip" not in line]
    assert len(installs) == 1 and installs[0].endswith(" -e ."), installs
    assert "PYTHONWARNINGS='ignore:Editable installation:UserWarning'" in installs[0]
    test = subprocess.run([*fresh, "test"], capture_output=True, text=True, timeout=60, check=True).stdout
    assert any(line.endswith(" -e '.[test]'") for line in test.splitlines()), test
