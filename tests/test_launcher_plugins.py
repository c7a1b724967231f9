"""What the roles' plugins share (the collection vidcluster.launcher): the one polling machine that the follow of a job
and a dataset copy's transfer both run on, and how the plugins import this repository's trainer."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.vidcluster.launcher.plugins.plugin_utils import polling
from ansible_collections.vidcluster.launcher.plugins.plugin_utils.trainer import PACKAGE

REPO = Path(__file__).resolve().parent.parent


class Clock:
    """time.monotonic and time.sleep for the machine: a sleep moves the clock, nothing waits."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        assert self.now < 10_000, "the watch never ended"


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(polling, "time", fake)
    return fake


def looks(*states: Any) -> Any:
    """A look that returns these states one after the other (then the last one again)."""
    queue = list(states)
    return lambda: queue.pop(0) if len(queue) > 1 else queue[0]


def test_a_line_per_change_at_most_every_so_often_and_always_the_last(clock: Clock) -> None:
    shown: list[str] = []
    progress = [{"n": 0}, {"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}, {"n": 3, "done": True}]
    ended = polling.Poll(
        look=looks(*progress), ended=lambda s: "done" if s.get("done") else None, silent=lambda seconds: None,
        key=lambda s: (s["n"], bool(s.get("done"))), line=lambda s: f"n={s['n']}{' done' if s.get('done') else ''}",
        show=shown.append, every=2.0, pause=lambda elapsed, heard: 1.0, said=(0, False),
    ).run()  # fmt: skip
    # n=0 was said before the first look; n=1 at t=2, n=2 too soon after it (t=3), n=3 at t=4, the end always.
    assert ended == "done" and shown == ["n=1", "n=3", "n=3 done"]


def test_no_sign_of_life_for_too_long_ends_the_watch_and_silence_can_carry_on(clock: Clock) -> None:
    heard: list[float] = []

    def silent(seconds: float) -> str | None:
        heard.append(seconds)
        return "gave up" if seconds > 10 else None

    def watch(look: Any, **extra: Any) -> str:
        return polling.Poll(look=look, ended=lambda s: None, silent=silent, key=lambda s: s, line=str,
                            show=lambda line: None, pause=lambda elapsed, fresh: 4.0, **extra).run()

    assert watch(looks({"beat": 1}, None)) == "gave up" and heard == [4.0, 8.0, 12.0]
    heard.clear()  # a heartbeat that stops moving is silence too, when only a moving one is a sign of life
    assert watch(looks({"beat": 1}, {"beat": 2}, {"beat": 2}), alive=lambda s, last: s != last) == "gave up"
    assert heard == [4.0, 8.0, 12.0]
    heard.clear()  # 9 s of silence before this watch began: the first silent look is already past 10 s
    assert watch(looks(None), silent_for=9.0) == "gave up" and heard == [9.0, 13.0]


def test_the_deadline_ends_a_watch_that_goes_on(clock: Clock) -> None:
    watch = polling.Poll(look=looks({"epoch": 1}), ended=lambda s: None, silent=lambda seconds: None,
                         key=lambda s: s["epoch"], line=str, show=lambda line: None,
                         pause=lambda elapsed, heard: 30.0, deadline=clock.now + 100, overtime=lambda: "running")
    assert watch.run() == "running" and clock.now == 1000.0 + 120


def test_the_plugins_import_this_repositorys_trainer_and_nothing_else(tmp_path: Path) -> None:
    """Without the repository on sys.path (Ansible's own process) and with a decoy `trainer` package in the current
    folder, the plugins get this repository's trainer; and it stays the one every plugin gets."""
    decoy = tmp_path / "trainer"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise SystemExit('the decoy trainer was imported')\n")
    script = ("import sys\n"
              f"sys.path.append({str(REPO / 'collections')!r})\n"
              "from ansible_collections.vidcluster.launcher.plugins.plugin_utils.trainer import trainer_module\n"
              "layout = trainer_module('runtime.layout')\n"
              "assert trainer_module('runtime.report').__name__ == 'trainer.runtime.report'\n"
              "print(layout.__file__, layout.valid_job_id('../x'), sys.path.count(''))\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(PACKAGE / "runtime" / "layout.py"), "False", "1"]


def test_loading_the_filter_plugins_imports_no_trainer_module_until_a_filter_runs() -> None:
    """Ansible loads every role's filter plugin in each process it forks for a task: loading them (and listing their
    filters) must not import the trainer, which only the filters that use it pay for when they run."""
    script = ("import importlib.util, sys\n"
              "from pathlib import Path\n"
              f"sys.path.append({str(REPO / 'collections')!r})\n"
              "filters = {}\n"
              f"for path in sorted(Path({str(REPO / 'roles')!r}).glob('*/filter_plugins/*.py')):\n"
              "    spec = importlib.util.spec_from_file_location(path.stem, path)\n"
              "    module = importlib.util.module_from_spec(spec)\n"
              "    spec.loader.exec_module(module)\n"
              "    filters.update(module.FilterModule().filters())\n"
              "print(len(filters), sorted(name for name in sys.modules if name.split('.')[0] == 'trainer'))\n"
              "print(filters['cluster_job_id']('../x'), filters['slurm_launch_file']('experiment'))\n"
              "print(filters['ddp_launch_hub']({}) == '', 'trainer.runtime.report' in sys.modules)\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    loaded, called, hub = done.stdout.splitlines()
    assert int(loaded.split()[0]) > 20 and loaded.split(maxsplit=1)[1] == "[]", loaded
    assert "names a folder on every node" in called, called
    assert hub == "True True", hub
