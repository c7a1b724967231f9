"""A training process's imports run with the cyclic collector paused and end frozen (trainer/startup.py): torch and
the models load without the collector walking them again and again, and no collection walks them after."""

from __future__ import annotations

import gc
import subprocess
import sys

from tests.trainer.test_train import REPO
from trainer.startup import collector_paused


def test_the_collector_is_off_inside_and_what_was_made_there_is_frozen_after() -> None:
    assert gc.isenabled()
    frozen_before = gc.get_freeze_count()
    try:
        with collector_paused():
            assert not gc.isenabled()
            made = [[i] for i in range(10_000)]  # tracked objects
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen_before + len(made)
    finally:
        gc.unfreeze()  # this test process's objects back in the collections


def test_a_collector_turned_off_before_stays_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()


def test_the_trainers_imports_are_frozen_and_the_collector_is_on_after_them() -> None:
    probe = "import gc, trainer.train; print(gc.isenabled(), gc.get_freeze_count())"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True).stdout
    enabled, frozen = out.split()
    assert enabled == "True"
    assert int(frozen) > 200_000  # torch's, torchvision's and the trainer's objects (about 570,000 here)
