"""Child processes of the test control plane: each in its own process group, its output in a log
file, killed with its children when stopped, and with the test process if that dies first."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1
LOOPBACK = "127.0.0.1"


def _die_with_parent() -> None:
    # Linux: SIGKILL this child when the test process dies, even by SIGKILL: nothing outlives a run.
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """PATH and HOME only: a proxy or KUBECONFIG from the caller's shell must not reach the peers
    (the apiserver would send webhook calls through an HTTPS_PROXY)."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    env.update(extra or {})
    return env


def free_port(host: str = LOOPBACK) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class Process:
    def __init__(self, name: str, argv: Sequence[str], log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_file = log_dir / f"{name}.log"
        self.env = env
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        with self.log_file.open("ab") as log:
            self.popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=clean_env(self.env),
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_file.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive():
            assert self.popen is not None
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def stop(self, grace_s: float = 10.0) -> None:
        if self.popen is None:
            return
        if self.popen.poll() is None:
            self.kill(signal.SIGTERM)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.kill(signal.SIGKILL)
                self.popen.wait(5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)  # anything it left in its group

    def wait_for(self, ready: Callable[[], bool], *, within: float, what: str) -> None:
        deadline = time.monotonic() + within
        while True:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited ({self.popen and self.popen.returncode}) before {what}:\n"
                                   f"{self.tail()}")  # fmt: skip
            try:
                if ready():
                    return
            except Exception:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: no {what} after {within:.0f} s:\n{self.tail()}")
            time.sleep(0.1)
