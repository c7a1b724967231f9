"""Where a training process is, as its heartbeat carries it (trainer.heartbeat: ``at``, ``stepped``; the hub judges
it in trainer.runtime.job.verdict.hung): its step, its phase, and its usual step time, on the process's monotonic clock
(a clock the test moves)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from trainer import heartbeat
from trainer.runtime import schema
from trainer.runtime.contract import HEARTBEAT_DIR_ENV, WHERE_SUFFIX
from trainer.runtime.watch.messages import COLLECTIVE, COMPUTE, DATA, EVALUATE, STARTING, Where


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    made = Clock()
    monkeypatch.setattr(heartbeat.time, "monotonic", made)
    heartbeat.restart_progress()
    yield made
    heartbeat.restart_progress()


def where() -> Where:
    return heartbeat._PROGRESS.where


def step(clock: Clock, data_s: float, compute_s: float) -> None:
    heartbeat.at(DATA)
    clock.now += data_s
    heartbeat.at(COMPUTE)
    clock.now += compute_s
    heartbeat.at(heartbeat.GRADIENTS)
    heartbeat.stepped()


def test_the_usual_step_time_follows_the_steps_from_the_second_on(clock: Clock) -> None:
    assert where() == Where(step=0, phase=STARTING, since=100.0, step_at=100.0, step_s=None)
    clock.now += 30  # the attempt's start: group, checkpoint
    step(clock, 5.0, 20.0)  # the first step warms up (the loader starts, kernels are chosen)
    assert (where().step, where().step_s, where().step_at) == (1, None, 155.0)
    step(clock, 0.5, 1.5)
    assert (where().step, where().step_s) == (2, 2.0)
    step(clock, 1.0, 2.0)  # one slower step moves it a fifth of the way
    assert where().step_s == pytest.approx(2.2)
    assert (where().phase, where().since) == (heartbeat.GRADIENTS, where().step_at)


def test_an_epochs_end_is_no_step_its_time_is_not_counted_as_a_stall(clock: Clock) -> None:
    step(clock, 0.0, 1.0)
    step(clock, 0.0, 1.0)
    heartbeat.at(EVALUATE)
    clock.now += 600  # validation
    heartbeat.at(DATA)  # the next epoch: its first step's time starts now
    assert (where().step_at, where().since, where().step_s) == (clock.now, clock.now, 1.0)


def test_each_beat_writes_where_beside_it(clock: Clock, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(HEARTBEAT_DIR_ENV, str(tmp_path))
    step(clock, 0.5, 1.0)
    beat = tmp_path / "4242"
    heartbeat._write(beat)
    written = schema.parse(Where, json.loads((tmp_path / f"4242{WHERE_SUFFIX}").read_text()), "where")
    assert written == where() and beat.is_file()


def test_a_new_attempt_in_place_says_it_starts_at_once_not_at_the_next_beat(clock: Clock, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # Its supervisor hands it the next attempt as soon as it parks: a report of that attempt read before the next beat
    # must not carry where the attempt before stopped (the hub would name it hung).
    beat = tmp_path / "4242"
    monkeypatch.setattr(heartbeat._BEATING, "path", beat)
    step(clock, 0.5, 1.0)
    heartbeat.at(COLLECTIVE + "agree")
    heartbeat._write(beat)
    clock.now += 11  # its peer was lost: it waited in the collective
    heartbeat.restart_progress()
    written = schema.parse(Where, json.loads((tmp_path / f"4242{WHERE_SUFFIX}").read_text()), "where")
    assert (written.step, written.phase, written.since) == (0, STARTING, clock.now), written


def test_a_models_gradients_mark_the_all_reduce_with_one_hook_however_often_it_is_watched(clock: Clock) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    for _ in range(2):  # a model kept across attempts (restart in place) is watched again at each
        heartbeat.watch_gradients(model)
    heartbeat.at(COMPUTE)
    model(torch.ones(2, 3)).sum().backward()
    assert where().phase == heartbeat.GRADIENTS
    assert [len(p._post_accumulate_grad_hooks or {}) for p in model.parameters()] == [1, 1, 1, 1]
