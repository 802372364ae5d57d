"""The leader's background pass: bind project namespaces, let go of deleted ones, report drift.

Runs only while this process holds the Lease (`LeaderElector.on_started_leading`), and is
cancelled the moment it does not. Work comes from two sources:

- a full pass at start and every `run_ai_reconcile_interval_s` (read from the settings each time):
  every project namespace that is neither bound nor terminating is bound, every terminating one
  with our finalizer is let go, and bound ones are checked for department drift;
- namespace watch events (ClusterState listeners): a new project namespace or a deletion is
  queued and handled within moments. The listener only queues; remote work happens here;
- department moves: a namespace carrying a move's intent is looked at as soon as it is seen, and
  again when its holder's heartbeat would lapse (`mover.next_check_at`), so a move whose replica
  died is resumed within moments of that being proven (`webhook.runai.move_recovery`).

Run:ai unreachable: the pass stops early and retries with exponential backoff (capped by the
interval), and at once when the directory sees Run:ai answer again. Nothing here blocks the
creation of a project namespace: binding is always after the fact.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from webhook.core.departments import runai_department_for
from webhook.kube.events import EventRecorder
from webhook.runai.binding import (
    BINDING_ANNOTATION,
    FINALIZER,
    Binder,
    BindingBusy,
    BindingError,
    BindingUnavailable,
    RunaiDisabled,
)
from webhook.runai.directory import RunaiDirectory
from webhook.runai.left import LEFT_CONFIGMAP, LeftProjects
from webhook.snapshot import RUNAI_MOVE_ANNOTATION, RUNAI_PROJECT_ID_LABEL, LeftProject, NamespaceInfo
from webhook.state.store import ClusterState
from webhook.tasks import wait_for_event

log = logging.getLogger(__name__)

DRIFT_REASON = "RunaiDepartmentDrift"


@dataclass(slots=True)
class PassReport:
    bound: list[str] = field(default_factory=list)
    unbound: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    drift: dict[str, tuple[str, str]] = field(default_factory=dict)  # namespace -> (actual, expected)
    unavailable: bool = False  # Run:ai did not answer: the pass stopped early


class MoveRecovery(Protocol):
    async def recover_all(self, namespaces: Iterable[NamespaceInfo] | None = None) -> Sequence[object]: ...

    @property
    def next_check_at(self) -> float | None: ...


class ReservationSweeper(Protocol):
    async def sweep(self, now: float) -> Sequence[str]: ...


class Reconciler:
    def __init__(
        self,
        state: ClusterState,
        binder: Binder,
        directory: RunaiDirectory,
        events: EventRecorder,
        *,
        mover: MoveRecovery | None = None,
        sweeper: ReservationSweeper | None = None,
        left: LeftProjects | None = None,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
    ) -> None:
        self.state = state
        self.binder = binder
        self.directory = directory
        self.events = events
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        # Settles department moves left half-done (webhook.runai.departments.DepartmentMover).
        self.mover = mover
        # Deletes the GPU reservation ConfigMaps of namespaces that are gone (webhook.quota).
        self.sweeper = sweeper
        # Run:ai projects left by namespaces deleted while the integration was off.
        self.left = left
        self.passes = 0  # full passes completed (tests and metrics read it)
        self.last_report: PassReport | None = None
        self._queue: dict[str, None] = {}  # ordered set of namespaces to look at
        self._wake = asyncio.Event()
        self._failures = 0
        self._retry_at = 0.0  # monotonic: no Run:ai work before this (backoff)
        self._next_pass = 0.0  # monotonic
        self._moves_due: float | None = None  # monotonic: look at department moves then

    # -- event intake (synchronous, no I/O) ----------------------------------------------------
    def on_cluster_event(self, event: str, kind: str, obj: Mapping[str, Any]) -> None:
        if kind != "Namespace" or event != "apply":
            return
        info = NamespaceInfo.from_object(obj)
        if RUNAI_MOVE_ANNOTATION in info.annotations:
            self._moves_soon(time.monotonic())
        finalizers = (obj.get("metadata") or {}).get("finalizers") or ()
        if (info.deleting and FINALIZER in finalizers) or (
            info.is_project and not info.deleting and not info.runai_queue
        ):
            self.enqueue(info.name)

    def on_directory_refresh(self, reachable: bool | None) -> None:
        if reachable and self._failures:
            # Run:ai answers again: retry now, not at the end of the backoff.
            self._retry_at = 0.0
            self._next_pass = 0.0
            self._wake.set()

    def enqueue(self, namespace: str) -> None:
        self._queue[namespace] = None
        self._wake.set()

    def _moves_soon(self, at: float) -> None:
        if self._moves_due is None or at < self._moves_due:
            self._moves_due = at
            self._wake.set()

    def _schedule_moves(self) -> None:
        """Look at the moves again when the earliest live holder's heartbeat would lapse."""
        at = self.mover.next_check_at if self.mover is not None else None
        if at is not None:
            self._moves_soon(time.monotonic() + max(0.0, at - time.time()) + 0.1)

    def trigger_pass(self) -> None:
        """Run a full pass soon (settings changed)."""
        self._next_pass = 0.0
        self._wake.set()

    # -- the loop ------------------------------------------------------------------------------
    async def run(self) -> None:
        """Until cancelled (leadership lost or stopping)."""
        self.state.listeners.append(self.on_cluster_event)
        self.directory.listeners.append(self.on_directory_refresh)
        self._next_pass = 0.0
        try:
            while True:
                self._wake.clear()
                now = time.monotonic()
                if self._moves_due is not None and now >= max(self._moves_due, self._retry_at):
                    self._moves_due = None
                    try:
                        await self._recover_moves()
                    except Exception:
                        log.exception("department move recovery failed")
                    continue
                if now >= self._retry_at and (now >= self._next_pass or self._queue):
                    try:
                        if now >= self._next_pass:
                            await self._full_pass()
                        else:
                            await self._drain_queue()
                    except Exception:  # e.g. the Kubernetes API failing: retry later, keep leading
                        log.exception("reconcile step failed")
                        self._next_pass = max(self._next_pass, now + self.backoff_initial_s)
                        self._backoff()
                    continue
                due = max(self._retry_at, now if self._queue else self._next_pass)
                if self._moves_due is not None:
                    due = min(due, max(self._retry_at, self._moves_due))
                await wait_for_event(self._wake, max(0.0, due - now))
        finally:
            with contextlib.suppress(ValueError):
                self.state.listeners.remove(self.on_cluster_event)
            with contextlib.suppress(ValueError):
                self.directory.listeners.remove(self.on_directory_refresh)

    def _interval(self) -> float:
        return float(self.state.settings.run_ai_reconcile_interval_s)

    def _backoff(self) -> None:
        self._failures += 1
        ceiling = min(self.backoff_max_s, self._interval(), self.backoff_initial_s * 2 ** (self._failures - 1))
        self._retry_at = time.monotonic() + random.uniform(ceiling / 2, ceiling)

    def _recovered(self) -> None:
        self._failures = 0
        self._retry_at = 0.0

    # -- a full pass ---------------------------------------------------------------------------
    async def pass_once(self) -> PassReport:
        """One full pass now (also what the timer runs)."""
        report = PassReport()
        self._queue.clear()  # the pass covers everything queued so far
        enabled = self.state.settings.run_ai_enable
        self.binder.forget_unbound({info.name for info in self.state.namespaces.values() if info.deleting})
        for info in list(self.state.namespaces.values()):
            if info.deleting:
                await self._let_go(info.name, report)
                if report.unavailable:
                    break
        if enabled and not report.unavailable:
            reachable = await self.directory.refresh_now()
            if not reachable and self.state.settings.run_ai_enable:
                report.unavailable = True
            else:
                if self.mover is not None:
                    # A move whose holder died (e.g. the previous leader) is finished or rolled back.
                    await self.mover.recover_all(list(self.state.namespaces.values()))
                    self._schedule_moves()
                for info in list(self.state.namespaces.values()):
                    if info.is_project and not info.deleting and not info.runai_queue:
                        await self._bind(info.name, report)
                        if report.unavailable:
                            break
                if not report.unavailable:
                    self._check_drift(report)
                    await self._settle_left(report)
        if self.sweeper is not None:
            await self.sweeper.sweep(time.time())
        self.last_report = report
        return report

    async def _recover_moves(self) -> None:
        if self.mover is None or not self.state.settings.run_ai_enable:
            return
        await self.mover.recover_all(list(self.state.namespaces.values()))
        self._schedule_moves()

    async def _full_pass(self) -> None:
        if self.state.synced and not self.state.ready():
            # The server listens before its first lists end; a pass over half-listed caches
            # would see namespaces as missing. Look again shortly.
            self._next_pass = time.monotonic() + 0.5
            return
        report = await self.pass_once()
        self.passes += 1
        if report.unavailable:
            self._backoff()
            self._next_pass = self._retry_at  # the pass stopped early: run it again after the backoff
        else:
            self._recovered()
            self._next_pass = time.monotonic() + self._interval()
        if report.bound or report.unbound or report.failed or report.unavailable:
            log.info(
                "reconcile pass: bound %d, let go %d, failed %d%s",
                len(report.bound),
                len(report.unbound),
                len(report.failed),
                ", Run:ai unreachable" if report.unavailable else "",
            )

    async def _drain_queue(self) -> None:
        report = PassReport()
        while self._queue and not report.unavailable:
            namespace = next(iter(self._queue))
            del self._queue[namespace]
            info = self.state.namespaces.get(namespace)
            if info is None:
                continue
            if info.deleting:
                await self._let_go(namespace, report)
            elif info.is_project and not info.runai_queue and self.state.settings.run_ai_enable:
                await self._bind(namespace, report)
            if report.unavailable:
                self._queue[namespace] = None  # keep it for the retry
        if report.unavailable:
            self._backoff()
        elif report.bound or report.unbound:
            self._recovered()

    # -- one namespace -------------------------------------------------------------------------
    async def _bind(self, namespace: str, report: PassReport) -> None:
        try:
            result = await self.binder.ensure_bound(namespace, "background")
        except BindingBusy as exc:
            # Another binder is at it; look again soon, without counting it as Run:ai being down.
            log.info("%s", exc)
            report.failed[namespace] = str(exc)
            self._queue[namespace] = None
            self._retry_at = max(self._retry_at, time.monotonic() + self.backoff_initial_s)
        except BindingUnavailable as exc:
            report.unavailable = True
            report.failed[namespace] = str(exc)
            self.events.record(namespace, "RunaiBindingFailed", str(exc), warning=True)
        except RunaiDisabled:
            pass  # turned off mid-pass
        except BindingError as exc:
            report.failed[namespace] = str(exc)
            log.warning("binding %s failed: %s", namespace, exc)
            self.events.record(namespace, "RunaiBindingFailed", str(exc), warning=True)
        except Exception as exc:  # a bug or an unforeseen answer: one namespace must not stop the pass
            log.exception("binding %s failed unexpectedly", namespace)
            report.failed[namespace] = f"{type(exc).__name__}: {exc}"
        else:
            if result.outcome != "already":
                report.bound.append(namespace)

    async def _let_go(self, namespace: str, report: PassReport) -> None:
        info = self.state.namespaces.get(namespace)
        if info is None or not info.deleting:
            return
        if info.moving:
            # A department move owns the Run:ai project until it is settled (recover_all, below);
            # deleting now could miss a project the move creates after our delete.
            report.failed[namespace] = "waiting for its department move to settle"
            return
        if not self.state.settings.run_ai_enable:
            await self._let_go_while_off(info, report)
            return
        try:
            result = await self.binder.unbind_deleted(namespace)
        except BindingUnavailable as exc:
            report.unavailable = True
            report.failed[namespace] = str(exc)
            self.events.record(namespace, "RunaiUnbindDeferred", str(exc), warning=True)
        except RunaiDisabled:
            pass
        except BindingError as exc:
            report.failed[namespace] = str(exc)
            self.events.record(namespace, "RunaiUnbindFailed", str(exc), warning=True)
        except Exception as exc:
            log.exception("letting go of %s failed unexpectedly", namespace)
            report.failed[namespace] = f"{type(exc).__name__}: {exc}"
        else:
            if result.finalizer_removed:
                report.unbound.append(namespace)
                self.events.forget(namespace)

    async def _let_go_while_off(self, info: NamespaceInfo, report: PassReport) -> None:
        # Run:ai is off, so we may not call it (the seed: turning it off stops every call), and a
        # namespace must not stay Terminating for that. What we created in Run:ai (the project-id
        # label, or an unfinished intent) is written down first (webhook.runai.left), so that the
        # admin view lists it and the leader deletes it once Run:ai is on again; then the
        # namespace goes, with an Event saying what was left. Adopted or never-bound namespaces
        # have nothing of ours in Run:ai.
        ours = bool(info.runai_project_id or BINDING_ANNOTATION in info.annotations)
        left: LeftProject | None = None
        if ours and self.left is not None:
            try:
                left = await self.left.record(info)
            except Exception as exc:  # the Kubernetes API failing: keep the finalizer, try again
                report.failed[info.name] = f"cannot record the Run:ai project left behind: {exc}"
                self.events.record(
                    info.name,
                    "RunaiUnbindDeferred",
                    f"namespace deletion waits: the Run:ai project this system created for it cannot be "
                    f"recorded in ConfigMap {LEFT_CONFIGMAP} ({exc}); retrying",
                    warning=True,
                )
                return
        if not await self.binder.release_finalizer(info.name):
            return
        report.unbound.append(info.name)
        if left is not None:
            project = left.runai_project or info.name
            which = f"id {left.runai_project_id}" if left.runai_project_id else "its creation was unfinished"
            self.events.record(
                info.name,
                "RunaiProjectLeft",
                f"namespace deleted while run_ai_enable is false: the Run:ai project {project} ({which}) that "
                "this system created for it was not deleted, since no Run:ai call is made while the integration "
                f"is off. It is listed in GET /api/v1/admin/runai (left_in_runai, ConfigMap {LEFT_CONFIGMAP}); "
                "delete it in Run:ai, or turn Run:ai back on and the leader deletes it",
                warning=True,
            )

    async def _settle_left(self, report: PassReport) -> None:
        """Run:ai on and reachable: delete the projects recorded as left behind once no namespace
        of that name or queue is still terminating, unless a live one exists again (then it is bound
        to it, adopted: not ours to delete)."""
        if self.left is None:
            return
        try:
            records = await self.left.load()
        except Exception as exc:
            log.warning("cannot read %s: %s", LEFT_CONFIGMAP, exc)
            return
        settled = []
        # A namespace still terminating under that name or queue may be the very one that left the
        # project (the namespace controller takes its time): the record waits until it is gone. A
        # live one took the name or the queue back: the project is bound to it, not ours to delete.
        live: set[tuple[str, str]] = set()
        leaving: set[tuple[str, str]] = set()
        for ns in self.state.namespaces.values():
            held = leaving if ns.deleting else live
            held.add(("namespace", ns.name))
            if ns.runai_queue:
                held.add(("queue", ns.runai_queue))
        for record in records:
            keys = {("namespace", record.namespace)}
            if record.runai_project:
                keys.add(("queue", record.runai_project))
            came_back = bool(keys & live)
            if not came_back and keys & leaving:
                continue
            if not came_back:
                labels = {RUNAI_PROJECT_ID_LABEL: record.runai_project_id} if record.runai_project_id else {}
                annotations = {} if record.runai_project_id else {BINDING_ANNOTATION: "{}"}
                gone = NamespaceInfo(record.namespace, labels=labels, annotations=annotations, deleting=True)
                try:
                    deleted = await self.binder.delete_left(gone)
                except BindingUnavailable as exc:
                    report.unavailable = True
                    report.failed[record.namespace] = str(exc)
                    break
                except BindingError as exc:
                    report.failed[record.namespace] = str(exc)
                    continue
                if deleted:
                    self.events.record(
                        record.namespace,
                        "RunaiProjectDeleted",
                        f"deleted the Run:ai project {', '.join(deleted)} left behind when the namespace was "
                        "deleted while run_ai_enable was false",
                    )
            settled.append(record.namespace)
        if settled:
            try:
                await self.left.drop(settled)
            except Exception as exc:
                log.warning("cannot update %s: %s", LEFT_CONFIGMAP, exc)

    # -- drift ---------------------------------------------------------------------------------
    def _check_drift(self, report: PassReport) -> None:
        names = self.directory.department_names()
        view = self.directory.view
        if names is None or view is None:
            return
        settings = self.state.settings
        for info in self.state.namespaces.values():
            if not info.is_project or info.deleting or info.moving or not info.runai_queue:
                continue
            project = self.directory.project_for_namespace(info.name)
            if project is None:
                continue
            department = view.department_by_id(project.parent_id)
            actual = department.name if department is not None else str(project.parent_id)
            expected = runai_department_for(info.department, settings, names) or settings.run_ai_default_department
            if actual == expected:
                self.events.forget(info.name, DRIFT_REASON)
                continue
            report.drift[info.name] = (actual, expected)
            owner = (
                "created by this system" if info.runai_project_id else "adopted; a Run:ai administrator must move it"
            )
            self.events.record(
                info.name,
                DRIFT_REASON,
                f"the Run:ai project {project.name} is in department {actual}, expected {expected} ({owner})",
                warning=True,
            )
