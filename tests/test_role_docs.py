"""Role READMEs are rendered from meta/argument_specs.yml by scripts/render_role_docs.py and must not drift."""

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent


def _renderer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("render_role_docs", REPO / "scripts" / "render_role_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_role_has_a_spec_and_a_readme() -> None:
    roles = sorted(path for path in (REPO / "roles").iterdir() if path.is_dir())
    assert roles
    assert [path for path in roles if not (path / "meta" / "argument_specs.yml").is_file()] == []
    assert [path for path in roles if not (path / "README.md").is_file()] == []


def test_role_readmes_are_not_stale() -> None:
    stale = _renderer().check(REPO)
    assert stale == [], "stale role READMEs (run .venv/bin/python scripts/render_role_docs.py): " + ", ".join(
        str(path.relative_to(REPO)) for path in stale
    )
