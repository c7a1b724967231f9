"""Where a training process is, as its heartbeat carries it (trainer.heartbeat: ``at``, ``stepped``; the hub judges
it in trainer.runtime.job.verdict.hung): its step, its phase, and its usual step time, on the process's monotonic clock
(a clock the test moves)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from trainer import engine, heartbeat
from trainer.config import Config
from trainer.distributed import DistContext
from trainer.inplace import LeftAttempt
from trainer.runtime import schema
from trainer.runtime.contract import HEARTBEAT_DIR_ENV, WHERE_SUFFIX
from trainer.runtime.watch.messages import COLLECTIVE, COMPUTE, DATA, EVALUATE, STARTING, VALIDATE, Where

ONE_PROCESS = DistContext(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, num_nodes=1,
                          device=torch.device("cpu"), backend="gloo", distributed=False, dist_url="")


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


class Validated(torch.nn.Module):
    """A model whose forward takes ``seconds`` of the test's clock and notes where the heartbeat says it is."""

    def __init__(self, clock: Clock, seconds: float) -> None:
        super().__init__()
        self.clock, self.seconds = clock, seconds
        self.seen: list[tuple[str, float]] = []

    def forward(self, video: torch.Tensor) -> torch.Tensor:
        self.seen.append((where().phase, where().step_at))
        self.clock.now += self.seconds
        return torch.zeros(len(video), 2)


def val_batches(count: int) -> list[dict[str, object]]:
    return [{"video": torch.zeros(2, 3, 1, 4, 4, dtype=torch.uint8), "label": torch.zeros(2, dtype=torch.long),
             "bad": [], "fallback": []} for _ in range(count)]


def test_a_validating_rank_is_judged_by_its_batches_then_waits_in_the_sums(clock: Clock,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # A rank stuck in a validation batch (a loader worker that never answers) is named hung by the hub while its
    # peers wait in the sums (trainer.runtime.job.verdict.hung), not left to the collective's timeout.
    step(clock, 0.0, 1.0)
    step(clock, 0.0, 1.0)
    heartbeat.at(EVALUATE)
    clock.now += 30  # the epoch's end before validation (gathers, precise BatchNorm): no step is due
    entered = clock.now
    summed: list[Where] = []
    monkeypatch.setattr(engine, "all_reduce_sum", lambda tensor: summed.append(where()))
    model = Validated(clock, 4.0)
    scores = engine.evaluate(model, val_batches(3), ONE_PROCESS, Config())
    # Each batch starts the stall clock again; the step count and the usual step time stay the training's.
    assert model.seen == [(VALIDATE, entered), (VALIDATE, entered + 4), (VALIDATE, entered + 8)]
    assert [(w.phase, w.step_at) for w in summed] == [(engine.METRICS, entered + 12)]
    assert (where().phase, where().step, where().step_s) == (EVALUATE, 2, 1.0)
    assert scores["count"] == 6


def test_a_rank_told_its_attempt_is_over_while_validating_leaves_at_its_next_batch(clock: Clock) -> None:
    model = Validated(clock, 1.0)

    def told() -> None:  # trainer.train.leave_if_told, once the supervisor's word came during the first batch
        raise LeftAttempt("the supervisor says attempt 0 is over")

    with pytest.raises(LeftAttempt):
        engine.evaluate(model, val_batches(5), ONE_PROCESS, Config(), each_batch=told)
    assert len(model.seen) == 1
