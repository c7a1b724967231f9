"""Every speed goal of the trainer in one run, as ratios against baselines measured in the same run.

    .venv/bin/python -m bench [--quick]
        [--only loader ddp fsdp hfstep multigrid decoders gpu launch checkpoint restarts elastic join watch]

Prints one table: what was measured, its value, the baseline's, the ratio, the goal and whether it is met. The parts
(each also runnable alone): bench/loader.py (decode-only vs dataset item vs DataLoader; antialiasing),
bench/ddp.py (1 vs 2 gloo processes), bench/fsdp.py (ViT-S VideoMAE steps at 2 ranks, FSDP2 vs DDP: time and peak
memory per rank), bench/hf_step.py (a VideoMAE step through the trainer's epoch loop vs a plain PyTorch loop, same
model and clips, interleaved), bench/multigrid.py (multigrid vs baseline training), bench/decoders.py (decord
vs torchcodec), bench/gpu_step.py (SlowFast 8x8 steps on a GPU; skipped without CUDA), bench/launch_overhead.py
(launch-training.yml to the first step on a 2-node local cluster; root; skipped otherwise), bench/checkpoint.py (the
training loop blocked by a background vs a synchronous checkpoint save; the per-step agreement vs a training step),
bench/restarts.py (a restart's cost and phases against torchrun's, in the same run; root; 15 to 30 minutes),
bench/elastic.py (a node lost with no spare: torchrun --nnodes=1:2, torchft and restart in place side by side; needs
torchft from requirements-dev.txt; about 2 minutes), bench/join_state.py (a joiner's optimizer state from its donor,
tensor by tensor vs pickled whole: wait and peak memory),
bench/watch_scale.py (the watch with a real hub and 64, 256 and 1,024 stand-in members; about 10 minutes).
--quick: fewer clips, steps and epochs, and no restarts, elastic or watch section unless --only names it; without it,
more of each (steadier ratios).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
from collections.abc import Callable

from bench import (
    checkpoint,
    ddp,
    decoders,
    elastic,
    fsdp,
    gpu_step,
    hf_step,
    join_state,
    launch_overhead,
    loader,
    local,
    multigrid,
    restarts,
    watch_scale,
)

Row = tuple[str, str, str, float | None, str, bool | None]  # what, value, baseline, ratio, goal, met


def loader_rows(quick: bool) -> list[Row]:
    r = loader.run(quick)
    n, aa = r["workers"], r["antialias"]
    return [
        ("dataset item, GPU node (crop made on the GPU) vs decode-only, clips/s", f"{r['item']:.1f}",
         f"{r['decode']:.1f}", r["item"] / r["decode"], ">= 0.85x", r["item"] / r["decode"] >= 0.85),
        ("  the item on a CPU-only node (crop made in the worker)", f"{r['item_cpu_node']:.1f}", f"{r['decode']:.1f}",
         r["item_cpu_node"] / r["decode"], "reference", None),
        ("  the item made in the worker (before: resized, flipped, normalised)", f"{r['item_before']:.1f}",
         f"{r['decode']:.1f}", r["item_before"] / r["decode"], "reference", None),
        ("  the item decoded under DECODE_TIME_LIMIT (in its helper) vs in the worker itself", f"{r['item']:.1f}",
         f"{r['item_no_limit']:.1f}", r["item"] / r["item_no_limit"], "reference", None),
        ("  making a batch's crops on the device, here a CPU, ms per clip", f"{r['device_ms']:.1f}", "", None,
         "on a GPU: microseconds", None),
        (f"DataLoader, GPU node, {n} workers vs {n} decode-only processes, clips/s", f"{r['loader']:.1f}",
         f"{r['parallel_decode']:.1f}", r["loader"] / r["parallel_decode"], ">= 0.85x",
         r["loader"] / r["parallel_decode"] >= 0.85),
        ("3x shrink, antialiased vs plain bilinear, time", "", "", aa["time"], "cost", None),
        ("  mean error vs area average, antialiased / plain (levels)", f"{aa['error_aa']:.2f}",
         f"{aa['error_plain']:.2f}", aa["error_aa"] / aa["error_plain"], "what it buys", None),
    ]


def ddp_rows(quick: bool) -> list[Row]:
    r = ddp.run(quick)
    ratio = r["two"] / r["one"]
    return [
        (f"steps/s per process, 2-process gloo DDP vs 1 process ({r['model']})", f"{r['two']:.2f}",
         f"{r['one']:.2f}", ratio, ">= 0.9x", ratio >= 0.9),
        ("  2-process DDP vs 2 independent processes side by side (DDP's own cost)", f"{r['two']:.2f}",
         f"{r['two_alone']:.2f}", r["two"] / r["two_alone"], "reference", None),
    ]


def fsdp_rows(quick: bool) -> list[Row]:
    r = fsdp.run(quick)
    base = r["ddp"]
    rows: list[Row] = []
    for name in ("fsdp2", "fsdp2_checkpointing"):
        m = r[name]
        ratio = m["peak_mib"] / base["peak_mib"]
        rows += [
            (f"peak memory per rank, {name} vs DDP, 2 ranks ({r['model']}), MiB", f"{m['peak_mib']:.0f}",
             f"{base['peak_mib']:.0f}", ratio, "<= 0.6x", ratio <= 0.6),
            ("  step time, s", f"{m['step_s']:.2f}", f"{base['step_s']:.2f}", m["step_s"] / base["step_s"], "info",
             None),
        ]
    return rows


def hf_step_rows(quick: bool) -> list[Row]:
    r = hf_step.run(quick)
    ratio = r["ours"] / r["plain"]
    return [(f"training step, the trainer's (train_one_epoch, build_optimizer AdamW) vs a plain loop, 1 process "
             f"({r['model']}), s", f"{r['ours']:.3f}", f"{r['plain']:.3f}", ratio, f"<= {hf_step.GOAL}x",
             ratio <= hf_step.GOAL)]


def multigrid_rows(quick: bool) -> list[Row]:
    with contextlib.redirect_stdout(io.StringIO()):  # the training runs' progress bars
        r = multigrid.run(quick)
    ratio = r["multigrid_s"] / r["baseline_s"]
    points = r["multigrid_top1"] - r["baseline_top1"]
    return [
        (f"multigrid (both cycles) vs baseline, {r['epochs']} epochs, wall s", f"{r['multigrid_s']:.1f}",
         f"{r['baseline_s']:.1f}", ratio, "<= 0.5x", ratio <= 0.5),
        ("  final validation top-1, %", f"{r['multigrid_top1']:.1f}", f"{r['baseline_top1']:.1f}", None,
         "within 5 points", abs(points) <= 5 or points > 0),
    ]


def decoder_rows(quick: bool) -> list[Row]:
    r = decoders.measure(2, 20, 1) if quick else decoders.measure(3, 60, 3)
    rates = r["rates"]
    base = rates["decord"]
    return [(f"{name} vs decord, clips/s", f"{rate:.1f}", f"{base:.1f}", rate / base, "info", None)
            for name, rate in rates.items() if name != "decord"]


def gpu_rows(quick: bool) -> list[Row]:
    try:
        rows = gpu_step.run(steps=10 if quick else 30)
    except RuntimeError as exc:
        if str(exc) != gpu_step.NEEDS_CUDA:
            raise
        return [("SlowFast 8x8 GPU step (bench/gpu_step.py)", "skipped", "", None, gpu_step.NEEDS_CUDA, None)]
    base = rows[0][1]
    return [(f"GPU step, {name}: ms (data wait, peak GiB)", "skipped", "", None, m["skipped"], None) if "skipped" in m
            else (f"GPU step, {name}: ms (data wait, peak GiB)",
                  f"{1000 * m['step_s']:.1f} ({100 * m['data_wait']:.0f}%, {m['peak_gib']:.1f})",
                  f"{1000 * base['step_s']:.1f}", m["step_s"] / base["step_s"], "info", None) for name, m in rows[1:]]


def launch_rows(quick: bool) -> list[Row]:
    try:
        r = launch_overhead.run(repeats=2 if quick else 3)
    except RuntimeError as exc:
        if str(exc) != local.NEEDS_ROOT:
            raise
        return [("launch-training.yml to the first step (bench/launch_overhead.py)", "skipped", "", None,
                 local.NEEDS_ROOT, None)]
    goal = launch_overhead.GOAL_S
    return [(f"launch-training.yml start to the first step on every node (2-node local cluster), {when}, s",
             f"{r[key]:.1f}", f"{r['import_s']:.1f}", r[key] / r["import_s"], f"<= import + {goal:.0f} s",
             r[key] - r["import_s"] <= goal)
            for when, key in (("first launch (ships the code)", "first_launch_s"), ("later launches", "launch_s"))]


def checkpoint_rows(quick: bool) -> list[Row]:
    r = checkpoint.run(quick)
    save, agreement = r["save"], r["agreement"]
    blocked, share = save["background"] / save["synchronous"], agreement["agree"] / agreement["step"]
    return [
        (f"checkpoint of {r['saved_model']} + SGD state ({save['mib']:.0f} MiB): training held up, background vs "
         "synchronous save, ms", f"{1000 * save['background']:.0f}", f"{1000 * save['synchronous']:.0f}", blocked,
         "<= 0.5x", blocked <= 0.5),
        ("  the background write itself, from the copy to the file on disk (while training goes on), ms",
         f"{1000 * save['written']:.0f}", "", None, "info", None),
        (f"per-step agreement (all-reduce of 3 integers, 2-process gloo) vs a training step ({r['trained_model']}), "
         "ms", f"{1000 * agreement['agree']:.3f}", f"{1000 * agreement['step']:.1f}", share, "<= 0.01x",
         share <= 0.01),
    ]


def restart_rows(quick: bool) -> list[Row]:
    try:
        found = restarts.rows(restarts.compare())
    except RuntimeError as exc:
        if str(exc) != local.NEEDS_ROOT:
            raise
        return [("a restart against torchrun's (bench/restarts.py)", "skipped", "", None, local.NEEDS_ROOT, None)]
    base = next(row for row in found if row.launcher == "torchrun")
    met = restarts.goals(found)
    rows: list[Row] = []
    for row in found:
        costs = [held for goal, held in met.items() if goal.startswith(f"{row.launcher}: the kill costs at most t")]
        in_place = [held for goal, held in met.items() if goal.startswith(f"{row.launcher}: the kill costs at most ")
                    and not goal.endswith("torchrun's")]
        rows += [
            (f"{row.launcher}: one SIGKILL's cost within the run, s (± half a step)", f"{row.stall_s:.1f}",
             f"{base.stall_s:.1f}", row.stall_s / base.stall_s, "<= torchrun's" if costs else "reference",
             costs[0] if costs else None),
            ("  the same less the steps lost, s", f"{row.stall_s - (row.lost_s or 0.0):.1f}", "", None,
             f"<= {restarts.IN_PLACE_GOAL_S:.0f} s" if in_place else "info", in_place[0] if in_place else None),
            ("  across runs (wall with it - without), s", f"{row.cost_s:.1f}", f"{base.cost_s:.1f}",
             row.cost_s / base.cost_s, "info", None),
        ]
    return rows


def elastic_rows(quick: bool) -> list[Row]:
    arms = elastic.compare()
    met = elastic.goals(arms)
    ours = next(arm for arm in arms if arm.name == "ours")
    best = min((arm for arm in arms if arm is not ours), key=lambda arm: arm.stall_s)
    rows: list[Row] = []
    for arm in arms:
        mine = arm is ours
        rows += [
            (f"a node lost with no spare, {arm.name}{' (detection driven by the bench, 0 s)' if mine else ''}: the "
             f"survivor's stall, s (a step: {arm.step_s:.2f} s)",
             f"{arm.stall_s:.1f}", f"{best.stall_s:.1f}" if mine else "",
             arm.stall_s / best.stall_s if mine and best.stall_s else None, "the smallest" if mine else "reference",
             met["ours: the smallest stall"] if mine else None),
            ("  steps trained again", str(arm.again), "", None, "0" if mine else "info",
             met["ours: 0 steps trained again"] if mine else None),
            ("  global batch before -> after", f"{arm.batch_before} -> {arm.batch_after}", "", None,
             "unchanged" if mine else "info", met["ours: the global batch unchanged"] if mine else None),
            ("  checkpoints loaded / final val top-1 % / wall s",
             f"{arm.loads} / {'-' if arm.top1 is None else f'{arm.top1:.1f}'} / {arm.wall_s:.0f}", "", None, "info",
             None),
        ]
    return rows


def join_rows(quick: bool) -> list[Row]:
    found = join_state.run()
    old, ours = found["pickled"], found["tensor by tensor"]
    met = join_state.goals(found)
    mib = 2**20
    return [
        (f"a joiner's AdamW state ({ours['state_b'] / mib:.0f} MiB, VideoMAE-B's size) from its donor, tensor by "
         "tensor vs pickled whole: the joiner's wait, s", f"{ours['wait_s']:.2f}", f"{old['wait_s']:.2f}",
         ours["wait_s"] / old["wait_s"], "info", None),
        ("  the donor's extra peak memory, MiB", f"{ours['donor_b'] / mib:.0f}", f"{old['donor_b'] / mib:.0f}",
         None, f"<= {join_state.DONOR_GOAL}x the state", met["donor"]),
        ("  the joiner's extra peak memory, MiB", f"{ours['joiner_b'] / mib:.0f}", f"{old['joiner_b'] / mib:.0f}",
         ours["joiner_b"] / old["joiner_b"], f"<= {join_state.JOINER_GOAL}x the state",
         met["joiner"] and met["exact"]),
    ]


def watch_rows(quick: bool) -> list[Row]:
    after = watch_scale.run()
    before = {r["members"]: r for r in watch_scale.run(watch_scale.BEFORE_SIZES, before=True)}
    shown = watch_scale.shown
    rows: list[Row] = []
    for r in after:
        n, old = r["members"], before.get(r["members"])
        sent, cpu = r["to_members_B"] or 0.0, r["hub_cpu"] or 0.0
        baseline = (old or {}).get("to_members_B")
        detected = [t for t in (r["detect_s"], r["silent_s"]) if t is not None]
        limit = (r["heartbeat_s"] or 0.0) + watch_scale.DETECT_MARGIN_S
        rows += [
            (f"watch, {n} members (heartbeat timeout {shown(r['heartbeat_s'], digits=0)} s): hub to members per "
             "report period, kB (baseline: the record on every report)",
             shown(sent, 1e3), shown(baseline, 1e3) if old else "", sent / baseline if baseline else None, "info",
             None),
            ("  the hub's CPU, s per s", shown(cpu, digits=2), "", None, "< 1 core" if n == max(watch_scale.SIZES)
             else "info", cpu < 1 if n == max(watch_scale.SIZES) else None),
            ("  a killed trainer / a silent member named by the hub, s",
             f"{shown(r['detect_s'])} / {shown(r['silent_s'])}", "", None, f"<= {limit:g} s",
             all(t <= limit for t in detected)),
            ("  the next attempt held by every member, median / max s",
             f"{shown(r['propagate_median_s'])} / {shown(r['propagate_max_s'])}", "", None, "info", None),
        ]
    return rows


SECTIONS: dict[str, Callable[[bool], list[Row]]] = {
    "loader": loader_rows, "ddp": ddp_rows, "fsdp": fsdp_rows, "hfstep": hf_step_rows, "multigrid": multigrid_rows,
    "decoders": decoder_rows, "gpu": gpu_rows, "launch": launch_rows, "checkpoint": checkpoint_rows,
    "restarts": restart_rows, "elastic": elastic_rows, "join": join_rows, "watch": watch_rows,
}
# whole jobs under several launchers (15 to 30 minutes; the elastic ones: about 2 minutes, and torchft), the watch at
# fleet size (about 10 minutes): --quick leaves them out unless named
LONG = ("restarts", "elastic", "watch")


def sections(quick: bool, only: list[str] | None) -> list[str]:
    """The parts to run: those named, else every part (--quick: but the LONG ones)."""
    return only if only is not None else [name for name in SECTIONS if not (quick and name in LONG)]


def table(rows: list[Row]) -> str:
    lines = ["| measurement | value | baseline | ratio | goal | met |", "|---|---|---|---|---|---|"]
    for what, value, base, ratio, goal, met in rows:
        shown = "" if ratio is None else f"{ratio:.2f}x"
        verdict = "" if met is None else ("yes" if met else "**no**")
        lines.append(f"| {what} | {value} | {base} | {shown} | {goal} | {verdict} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer clips, steps and epochs")
    parser.add_argument("--only", nargs="+", choices=sorted(SECTIONS), default=None, help="parts to run")
    args = parser.parse_args(argv)
    args.only = sections(args.quick, args.only)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows: list[Row] = []
    start, load = time.perf_counter(), os.getloadavg()[0]
    for name in args.only:
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        rows += SECTIONS[name](args.quick)
    print(table(rows))
    print(f"\n{os.cpu_count()} CPU cores (load average {load:.1f} before, {os.getloadavg()[0]:.1f} after: other "
          f"work on the machine), {'quick' if args.quick else 'full'} run, {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
