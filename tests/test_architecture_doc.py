"""docs/ARCHITECTURE.md shows the whole house: every module it names exists, and every module of
webhook/ is named, so the page cannot fall behind a move."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
PACKAGE = ROOT / "webhook"


def named_paths() -> set[str]:
    """`name.py` and `pkg/name.py` in backticks, read relative to webhook/ (or to the repository)."""
    return set(re.findall(r"`((?:[\w.]+/)*\w+\.py|[\w]+/)`", PAGE))


def exists(name: str) -> bool:
    """`pkg/mod.py` under webhook/ (or the repository, or tests/support); a bare `mod.py` anywhere in webhook/
    (the page lists a package's modules after the package)."""
    if name.endswith("/"):
        return (PACKAGE / name).is_dir() or (ROOT / name).is_dir()
    if "/" in name:
        return any((base / name).exists() for base in (PACKAGE, ROOT, ROOT / "tests" / "support"))
    return (PACKAGE / name).exists() or any(PACKAGE.rglob(name)) or (ROOT / "tests" / "support" / name).exists()


def test_every_module_the_page_names_exists() -> None:
    missing = sorted(name for name in named_paths() if not exists(name))
    assert not missing, f"docs/ARCHITECTURE.md names modules that do not exist: {missing}"


def test_every_module_of_the_package_is_on_the_page() -> None:
    named = named_paths()
    bare = {Path(p).name for p in named}
    unnamed = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if path.name not in ("__init__.py", "__main__.py")
        and str(path.relative_to(PACKAGE)) not in named
        and not (path.parent != PACKAGE and path.name in bare)  # `kube/` lists its modules bare
    )
    assert not unnamed, f"docs/ARCHITECTURE.md does not say where these live: {unnamed}"
