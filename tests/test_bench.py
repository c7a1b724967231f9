"""python -m bench --quick stays quick: the restart comparison (whole jobs under several launchers, about 15 minutes),
the elastic one (about 2 minutes) and the watch at fleet size (about 10 minutes) run only when asked for by name, or
in a full run."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from bench import elastic, goodput, hf_step, rejoin
from bench.__main__ import SECTIONS, sections
from bench.restarts import STEPS, Run, goals, rows
from trainer.runtime.job.pace import Effort
from trainer.runtime.job.record import Kind


def test_quick_leaves_the_restart_comparison_and_the_watch_out_unless_named() -> None:
    assert "restarts" not in sections(True, None) and "checkpoint" in sections(True, None)
    assert "watch" not in sections(True, None)
    assert sections(False, None) == list(SECTIONS)
    assert sections(True, ["restarts"]) == ["restarts"]
    assert sections(True, ["watch"]) == ["watch"]
    assert "elastic" not in sections(True, None) and sections(True, ["elastic"]) == ["elastic"]


def _run(launcher: str, killed: bool, wall: float, step: float = 0.0, again: float = 0.0, lost: int = 0) -> Run:
    """A run as bench/restarts.py records it: the kill at t=1000, the next attempt's first step ``again`` later."""
    phases = {name: 1000.0 + again for name in STEPS} if killed else {}
    return Run(launcher, killed, wall, kill_at=1000.0 if killed else None, phases=phases, how="",
               lost_steps=lost if killed else None, step_s=step)


def test_a_kill_is_costed_within_its_run_so_a_slower_round_does_not_hide_it() -> None:
    # torchrun: training again 20 s after the kill at 4 s a step, one step lost: the job stood still 20 - 4/2 s and
    # went back 4 s. The runtime in place: 6 s, at 4 s a step, nothing lost: 4 s. Its clean run was the slower one
    # (other jobs on the machine), so the wall times say the kill cost it nothing; the within-run cost still counts it.
    runs = [_run("torchrun", False, 100.0), _run("torchrun", True, 120.0, step=4.0, again=20.0, lost=1),
            _run("runtime, shipped defaults, restart in place", False, 140.0),
            _run("runtime, shipped defaults, restart in place", True, 130.0, step=4.0, again=6.0)]
    torchrun, in_place = rows(runs)
    assert (torchrun.stall_s, in_place.stall_s) == (22.0, 4.0)
    assert in_place.cost_s == -10.0  # across runs: noise
    assert goals([torchrun, in_place]) == {
        "runtime, shipped defaults, restart in place: the kill costs at most torchrun's": True,
        "runtime, shipped defaults, restart in place: the kill costs at most 5 s plus the steps lost": True}
    slow = rows([*runs[:3], _run("runtime, shipped defaults, restart in place", True, 130.0, step=4.0, again=8.0,
                                 lost=1)])
    assert slow[1].stall_s == 10.0 and not all(goals(slow).values())


def test_the_hf_step_bench_compares_the_same_training(tmp_path: Path) -> None:
    # bench/hf_step.py times the trainer's step against a plain loop: both must do the same work, so from the same
    # weights two steps on the same clips leave the same weights (AdamW, cross-entropy, the same normalised input).
    (ours_model, ours_steps), (plain_model, plain_steps) = hf_step.sides(tmp_path)
    before = [p.detach().clone() for p in plain_model.parameters()]
    ours_steps(2), plain_steps(2)
    pairs = list(zip(ours_model.parameters(), plain_model.parameters(), before, strict=True))
    assert all(torch.allclose(o, p, atol=1e-5) for o, p, _ in pairs)
    assert any(not torch.equal(p, b) for _, p, b in pairs)  # they trained


def _records(steps: list[tuple[int, int, float, int]]) -> list[dict[str, Any]]:
    """Sample-log lines as bench/elastic.py stamps them: (step, rank, seen at, attempt), 2 clips each."""
    return [{"step": step, "rank": rank, "t": t, "attempt": attempt, "samples": [0, 1]}
            for step, rank, t, attempt in steps]


def test_the_elastic_bench_reads_stall_steps_again_and_batches_from_the_sample_logs() -> None:
    # 2 ranks a step every second; the kill at 3.5 s; a resume from step 1's checkpoint: steps 2 and 3 again, the
    # first of them 10 s after step 3 (one rank left, its 2 micro-batches in one line).
    records = _records([(s, r, float(s), 0) for s in (1, 2, 3) for r in (0, 1)] + [(2, 0, 13.0, 1), (3, 0, 14.0, 1)])
    records[-2]["samples"] = records[-1]["samples"] = [0, 1, 2, 3]
    found = elastic.measure("torchrun", records, 3.5, lambda r: r["attempt"] == 1)
    assert found == {"stall_s": 10.0, "step_s": 1.0, "again": 2, "batch_before": 4, "batch_after": 4}
    # torchft's lines: one replica's clips and how many replicas averaged them.
    replicas = [{"step": 4, "rank": 0, "t": 4.0, "replicas": 2, "samples": [0, 1]},
                {"step": 5, "rank": 0, "t": 9.0, "replicas": 1, "samples": [2, 3]}]
    assert (elastic.global_batch(replicas, 4), elastic.global_batch(replicas, 5)) == (4, 2)


def test_the_rejoin_bench_counts_the_worlds_steps_from_the_hubs_decision_to_the_joiners_first() -> None:
    # Attempt 1 (2 ranks) steps every 0.1 s to step 9 at 10.9 s; node2 thawed at 10.25 (rank 0 had taken step 2),
    # the hub decided at 10.85 (step 8; the smaller world takes step 9 still); the grown world (attempt 2, node2 rank
    # 2) takes step 10 at 12.0 s, then 11.
    steps = [(s, r, 10.0 + s / 10, 1) for s in range(1, 10) for r in (0, 1)]
    steps += [(s, r, 12.0 + (s - 10) / 10, 2) for s in (10, 11) for r in (0, 1, 2)]
    found = rejoin.measure(_records(steps), thawed=10.25, decided=10.85, attempt=2, joiner=2, from_memory=True,
                           accumulation_back=True)
    assert (found.steps_after_decision, found.steps_after_thaw) == (2, 8)
    assert (round(found.answered_s, 2), round(found.trains_s, 2), round(found.pause_s, 2)) == (0.6, 1.15, 1.1)
    assert round(found.step_s, 3) == 0.1
    late = rejoin.measure(_records(steps), thawed=10.25, decided=10.45, attempt=2, joiner=2, from_memory=True,
                           accumulation_back=True)
    assert late.steps_after_decision == 6 and not rejoin.met([found, late]) and rejoin.met([found])
    assert not rejoin.met([dataclasses.replace(found, from_memory=False)])
    assert not rejoin.met([dataclasses.replace(found, accumulation_back=False)])
    assert "| 1 | 0.60 | 2 | 8 | 1.15 | 1.10 | 0.100 | yes | yes |" in rejoin.table([found])
    assert "| 1.10 | ? | yes |" in rejoin.table([dataclasses.replace(found, step_s=None)])


def _arm(name: str, stall: float, again: int = 0, after: int = 4) -> elastic.Arm:
    return elastic.Arm(name, stall_s=stall, step_s=0.1, again=again, loads=0, batch_before=4, batch_after=after,
                       top1=50.0, wall_s=60.0)


def test_the_elastic_goals_are_measured_not_assumed() -> None:
    arms = [_arm("torchrun", 40.0, again=3), _arm("torchft", 5.0, after=2), _arm("ours", 1.0)]
    assert all(elastic.goals(arms).values())
    assert "| ours " in elastic.table(arms) and "4 -> 2" in elastic.table(arms)
    worse = [_arm("torchrun", 40.0), _arm("torchft", 0.5, after=2), _arm("ours", 1.0, again=1, after=2)]
    assert not any(elastic.goals(worse).values())


def _worker(pid: int, world: int, steps: int, start_step: int, training_from: float,
            stepped_at: float) -> goodput.Worker:
    compute_s = 50.0 + pid  # the last worker of a round is its slowest
    effort = Effort(steps=steps, data_s=1.0, compute_s=compute_s, sync_s=10.0, checkpoint_s=2.0, checkpoints=1,
                    start_step=start_step, training_from=training_from, checkpoint_every_s=120.0)
    return goodput.Worker(pid, node=pid % 3, world=world, effort=effort, stepped_at=stepped_at)


def test_the_goodput_bench_rebuilds_torchruns_record_a_round_at_a_time() -> None:
    """torchrun keeps no record: its workers' heartbeats, in any order, make one attempt per rendezvous round. Launched
    at 0; 3 nodes trained from 10 to 100 (step 100); a kill: 3 anew from the checkpoint at step 80, from 120 to 200;
    a node hung: 2 from step 150, from 350 to 400; it came back: 3 from step 170, from 450 to 600; the end at 610."""
    first = [_worker(p, 3, 100, 0, 10.0 + p / 10, 100.0) for p in (1, 2, 3)]
    second = [_worker(p, 3, 80, 80, 120.0 + p / 10, 200.0) for p in (4, 5, 6)]
    shrunk = [_worker(p, 2, 20, 150, 350.0 + p / 10, 400.0) for p in (7, 8)]
    grown = [_worker(p, 3, 100, 170, 450.0 + p / 10, 600.0) for p in (9, 10, 11)]
    found = goodput.rounds([*grown, *shrunk, *second[::-1], *first])
    assert [[w.pid for w in members] for members in found] == [[1, 2, 3], [4, 5, 6], [7, 8], [9, 10, 11]]
    record = goodput.torchrun_record(0.0, 610.0, found)
    causes = [a.cause for a in record.attempts[1:]]
    assert [(c.kind, c.at) for c in causes if c is not None] == [(Kind.KILLED, 100.0), (Kind.LOST, 200.0),
                                                                 (Kind.JOINED, 400.0)]
    assert record.restarts == 2 and record.spent[0].effort.compute_s == 53.0  # the slowest worker of the round
    spent = record.goodput
    assert spent is not None and spent.wall_s == 610.0 and spent.startup_s == 10.3
    # steps 80 to 100 trained again by the second round, its steps 150 to 160 by the third, none by the last
    assert abs(spent.recomputed_s - (20 * (53.0 + 10.0) / 100 + 10 * (56.0 + 10.0) / 80)) < 0.06, spent
    assert abs(spent.restart_s - ((120.6 - 100) + (350.8 - 200) + (451.1 - 400))) < 0.06, spent
    parts = [getattr(spent, f"{part}_s") for part in goodput.GOODPUT_PARTS]
    assert abs(sum(parts) - spent.wall_s) < 0.5, spent
    table = goodput.report([goodput.Result("torchrun", record, "nodes per round: 3 -> 3 -> 2 -> 3")])
    assert "| torchrun | 2 | nodes per round: 3 -> 3 -> 2 -> 3 | 610 |" in table, table
