"""python -m bench --quick stays quick: the restart comparison (whole jobs under several launchers, about 15 minutes)
and the watch at fleet size (about 10 minutes) run only when asked for by name, or in a full run."""

from __future__ import annotations

from bench.__main__ import SECTIONS, sections


def test_quick_leaves_the_restart_comparison_and_the_watch_out_unless_named() -> None:
    assert "restarts" not in sections(True, None) and "checkpoint" in sections(True, None)
    assert "watch" not in sections(True, None)
    assert sections(False, None) == list(SECTIONS)
    assert sections(True, ["restarts"]) == ["restarts"]
    assert sections(True, ["watch"]) == ["watch"]
