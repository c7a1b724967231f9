"""python -m bench --quick stays quick: the restart comparison (whole jobs under several launchers, about 15 minutes),
the elastic one (about 2 minutes) and the watch at fleet size (about 10 minutes) run only when asked for by name, or
in a full run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from bench import elastic, hf_step
from bench.__main__ import SECTIONS, sections
from bench.restarts import STEPS, Run, goals, rows


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


def _arm(name: str, stall: float, again: int = 0, after: int = 4) -> elastic.Arm:
    return elastic.Arm(name, stall_s=stall, step_s=0.1, again=again, loads=0, batch_before=4, batch_after=after,
                       top1=50.0, wall_s=60.0)


def test_the_elastic_goals_are_measured_not_assumed() -> None:
    arms = [_arm("torchrun", 40.0, again=3), _arm("torchft", 5.0, after=2), _arm("ours", 1.0)]
    assert all(elastic.goals(arms).values())
    assert "| ours " in elastic.table(arms) and "4 -> 2" in elastic.table(arms)
    worse = [_arm("torchrun", 40.0), _arm("torchft", 0.5, after=2), _arm("ours", 1.0, again=1, after=2)]
    assert not any(elastic.goals(worse).values())
