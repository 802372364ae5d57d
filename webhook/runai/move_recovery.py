"""Resuming a department move whose holder is gone: take its intent over, then finish the move or
roll it back from what Run:ai holds.

When (`core.moves.takeover_due`): an intent held by another process is taken over as soon as that
process is proven gone. The leader knows it at once for the process it took the Lease over from
(`holders_gone`: that process stopped renewing the Lease, or released it on its way out); any other
holder is gone once its heartbeat (renewed every `move_intent.HEARTBEAT_S` while it holds the move)
is `stale_after_s` old. An intent naming this process whose move no longer runs here (cut short by
an error) is taken at once. The heartbeat is wall-clock time written by the holder and read here:
clocks kept by NTP are well inside the margin.

How: the takeover rewrites the intent with this process as holder, with the resourceVersion just
read, so of two recoverers one wins, and a holder that was only slow notices before its next
write. Then `MoveSteps.settle` looks at Run:ai. The leader's reconciler calls `recover_all` on each
pass, and again at `next_check_at` while a live holder's move is under way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable

from webhook.core.moves import takeover_due
from webhook.kube.api import Obj
from webhook.runai.move_intent import MOVE_ANNOTATION, IntentRecords, LostHold, MoveIntent, intent_of
from webhook.runai.move_outcomes import MoveError, MovePending, MoveResult, UnknownNamespace
from webhook.runai.move_steps import MoveSteps
from webhook.snapshot import PROJECT_LABEL, NamespaceInfo

log = logging.getLogger(__name__)

# A holder's heartbeat older than this proves it gone: five heartbeats missed.
STALE_AFTER_S = 20.0


class MoveRecoverer:
    def __init__(
        self,
        steps: MoveSteps,
        records: IntentRecords,
        list_namespaces: Callable[[str], Awaitable[list[Obj]]],
        *,
        instance: str,
        holders_gone: Callable[[], Collection[str]],
        stale_after_s: float = STALE_AFTER_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._steps = steps
        self._records = records
        self._list_namespaces = list_namespaces
        self.instance = instance
        self._holders_gone = holders_gone
        self.stale_after_s = stale_after_s
        self._clock = clock
        # When the earliest move seen held by a live holder may be taken over (epoch seconds).
        self.next_check_at: float | None = None
        self._next_check: float | None = None  # being gathered by the pass under way

    def _due(self, intent: MoveIntent, namespace: str) -> float | None:
        return takeover_due(
            intent.holder,
            intent.heartbeat_at,
            me=self.instance,
            running_here=self._records.held_here(namespace),
            holders_gone=self._holders_gone(),
            stale_after_s=self.stale_after_s,
        )

    async def recover(self, namespace: str) -> MoveResult | None:
        """Finish or roll back an interrupted move of `namespace`; None when there is none to take now."""
        try:
            obj = await self._records.read_namespace(namespace)
        except UnknownNamespace:
            return None
        intent = intent_of(obj)
        if intent is None:
            return None
        due = self._due(intent, namespace)
        if due is None or due > self._clock():
            if due is not None:
                self._check_by(due)  # the cache showed an older heartbeat than the API has
            return None
        async with self._records.holding(namespace):
            try:
                taken = await self._records.write_update(namespace, obj, intent, holder=self.instance)
            except LostHold:
                return None  # another recoverer won the takeover
            log.info("resuming the department move of %s (phase %s) held by %s", namespace, intent.phase, intent.holder)
            return await self._steps.settle(namespace, taken, cause=None)

    async def recover_all(self, namespaces: Iterable[NamespaceInfo] | None = None) -> list[MoveResult | MoveError]:
        """`recover` every namespace carrying an intent that may be taken over now; the reconciler
        calls it on each pass. `namespaces`: the cache's view (no list call, and an intent a live
        holder keeps fresh costs no call either); by default the API is listed.
        Never raises for one namespace: its error is in the returned list (and logged)."""
        if namespaces is None:
            candidates = [NamespaceInfo.from_object(o) for o in await self._list_namespaces(PROJECT_LABEL)]
        else:
            candidates = list(namespaces)
        now = self._clock()
        self._next_check = None
        outcomes: list[MoveResult | MoveError] = []
        for ns in candidates:
            raw = ns.annotations.get(MOVE_ANNOTATION)
            if raw is None:
                continue
            try:
                cached = MoveIntent.from_annotation(raw)
            except ValueError:
                cached = None  # `recover` reads it again and says what is wrong with it
            if cached is not None:
                due = self._due(cached, ns.name)
                if due is None:
                    continue
                if due > now:
                    self._check_by(due)
                    continue
            try:
                result = await self.recover(ns.name)
            except MoveError as exc:
                log.warning("department move of %s not settled: %s", ns.name, exc.message)
                outcomes.append(exc)
            except Exception as exc:  # one namespace must not stop the reconciler's pass
                log.exception("department move of %s: recovery failed", ns.name)
                outcomes.append(MovePending(f"{type(exc).__name__}: {exc}", namespace=ns.name))
            else:
                if result is not None:
                    outcomes.append(result)
        self.next_check_at = self._next_check
        return outcomes

    def _check_by(self, due: float) -> None:
        self._next_check = due if self._next_check is None else min(self._next_check, due)
