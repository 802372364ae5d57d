"""What a department move answers: its result, the department delete's, and its errors (each with
the HTTP status the admin API gives it), with the reminder texts the answers and Events carry."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from webhook.core.moves import label_text

__all__ = ["label_text"]  # the messages' way of showing a department label, for the saga's modules

Outcome = Literal["moved", "label-only", "unchanged", "rolled-back", "abandoned"]


def reminder_text(project: str, department: str) -> str:
    return (
        f"Re-add GPU quota and access rules in Run:ai: the Run:ai project {project} was created again in "
        f"Run:ai department {department} with no GPU quota, and Run:ai deleted the old project's access "
        "rules, limits and node-pool settings, and the assets created in its scope (credentials, templates)."
    )


def rollback_text(project: str, department: str) -> str:
    return (
        f"The Run:ai project {project} was created again in its old Run:ai department {department} with its "
        "old GPU quota and scheduling settings, but its access rules were deleted with it and are not "
        "restored: re-add them in Run:ai."
    )


class MoveError(Exception):
    """A move or delete did not complete. `status` is the HTTP status the admin API answers with."""

    status = 409
    code = "Conflict"

    def __init__(self, message: str, *, namespace: str | None = None, result: MoveResult | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.namespace = namespace
        self.result = result


class InvalidDepartment(MoveError):
    status, code = 400, "InvalidDepartment"


class UnknownNamespace(MoveError):
    status, code = 404, "NotFound"


class ProjectBusy(MoveError):
    """Pods run or wait in the namespace."""

    status, code = 409, "ProjectBusy"

    def __init__(self, message: str, *, namespace: str, pods: list[str]) -> None:
        super().__init__(message, namespace=namespace)
        self.pods = pods


class MoveInProgress(MoveError):
    status, code = 409, "MoveInProgress"


class MoveRolledBack(MoveError):
    """The project could not be created in the new department and is back in the old one."""

    code = "MoveRolledBack"

    def __init__(self, message: str, *, namespace: str, result: MoveResult, unreachable: bool) -> None:
        super().__init__(message, namespace=namespace, result=result)
        self.status = 503 if unreachable else 409


class DependencyUnavailable(MoveError):
    """Run:ai or the Kubernetes API could not be used; nothing changed."""

    status, code = 503, "Unavailable"


class MovePending(MoveError):
    """Run:ai was changed but the move could not be settled now; the intent stays for `recover`."""

    status, code = 503, "MovePending"


@dataclass(frozen=True, slots=True)
class MoveResult:
    """The answer to one move (also one entry of a department delete)."""

    namespace: str
    from_department: str | None  # the label values; None is the default department
    to_department: str | None
    outcome: Outcome
    message: str
    runai_project: str | None = None
    runai_from: str | None = None  # Run:ai department names
    runai_to: str | None = None
    old_project_id: str | None = None
    new_project_id: str | None = None
    drift: bool = False  # the Run:ai project stays in another Run:ai department than expected
    reminder: str | None = None
    dry_run: bool = False  # what the move would do; nothing was changed

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class DepartmentDeleteResult:
    department: str
    moved: list[MoveResult] = field(default_factory=list)
    failed: dict[str, Any] | None = None  # {"namespace", "status", "code", "reason", "pods"?}
    remaining: list[str] = field(default_factory=list)
    dry_run: bool = False  # what the delete would do; nothing was changed

    @property
    def complete(self) -> bool:
        return self.failed is None and not self.remaining

    @property
    def status(self) -> int:
        return 200 if self.failed is None else int(self.failed["status"])

    def to_json(self) -> dict[str, Any]:
        reminders = [m.reminder for m in self.moved if m.reminder]
        if self.complete and self.dry_run:
            message = (
                f"department {self.department}: {len(self.moved)} project(s) would move to the default department "
                "(dry run: nothing changed)"
            )
        elif self.dry_run:
            failed = self.failed or {}
            message = (
                f"department {self.department}: a delete would stop at {failed.get('namespace')}: "
                f"{failed.get('reason')} (dry run: nothing changed)"
            )
        elif self.complete:
            message = (
                f"department {self.department}: {len(self.moved)} project(s) moved to the default department; "
                "it has no projects left"
            )
        else:
            failed = self.failed or {}
            message = (
                f"department {self.department}: stopped at {failed.get('namespace')}: {failed.get('reason')}. "
                f"{len(self.moved)} project(s) moved before it stay in the default department; the department "
                f"keeps {len(self.remaining)} project(s) until it is deleted again"
            )
        return {
            "department": self.department,
            "complete": self.complete,
            "message": message,
            "moved": [m.to_json() for m in self.moved],
            "failed": self.failed,
            "remaining": list(self.remaining),
            "reminder": " ".join(dict.fromkeys(reminders)) or None,
            "dry_run": self.dry_run,
        }
