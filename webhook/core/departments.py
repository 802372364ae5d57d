"""Platform departments and the Run:ai departments they map to.

Used by the namespace guard (is a department edit a Run:ai move?), the Run:ai binding and move
workflows and the reconciler, so that all of them agree on where a project's Run:ai project belongs.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from webhook.settings import ClusterSettings

# Same rule as Run:ai department names: up to 63 of [a-z0-9-], alphanumeric at both ends.
_DEPARTMENT_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def department_name_error(name: str) -> str | None:
    """Why `name` is not a valid department name, or None when it is."""
    if _DEPARTMENT_RE.fullmatch(name):
        return None
    return (
        f"department {name!r} is not a valid name: use up to 63 lowercase letters, digits and '-', "
        "starting and ending with a letter or digit"
    )


def runai_department_for(
    department: str | None, settings: ClusterSettings, runai_departments: Collection[str] | None
) -> str | None:
    """The Run:ai department a platform department maps to; None when that cannot be known."""
    default = settings.run_ai_default_department
    # No department label is the default department; the default Run:ai department exists
    # (a prerequisite), so both map there whatever the cache knows.
    if department is None or department == default:
        return default
    if runai_departments is None:
        return None
    return department if department in runai_departments else default
