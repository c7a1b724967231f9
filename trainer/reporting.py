"""What a run tells the outside world, from global rank 0 (and metrics.jsonl from every checkpoint writer).

- console + ``log.txt`` (other ranks log warnings and errors only, to their own stderr),
- a tqdm progress bar with clips/s and data-wait time,
- TensorBoard event files in ``LOG.LOG_DIR``,
- ``bad_videos.json``: the run's bad videos so far, each with its reason (trainer.bad_videos), where metrics.jsonl
  is written,
- ``metrics.jsonl``: one JSON object per epoch (with its "epoch"), and one per restarted attempt (with "attempt":
  ``attempt_record``; readers that want epochs skip records without "epoch", as ``read_metrics`` does); written by
  rank 0 and mirrored by node 1's checkpoint writer (checkpoint.writes_checkpoints), so it survives either node;
  ``curves.png`` at the end,
- ``status.json``: a small file an external launcher polls, written atomically at most every STATUS_INTERVAL_S:
  state (starting, running, finished, failed, preempted), epoch, step, steps_per_epoch, lr, the last epoch's metrics,
  the recent clips/s (all ranks) and step time, the running train loss and top-1 of the epoch (rank 0's, every
  LOG.DISPLAY_FREQ steps), an ETA in seconds (remaining optimizer steps x recent step time, evaluation not counted),
  and the run's attempts.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from tqdm import tqdm

from trainer.distributed import DistContext
from trainer.errors import UserError
from trainer.runtime import atomic
from trainer.runtime.contract import (
    ATTEMPT_ENV,
    ATTEMPT_FIELDS,
    BAD_VIDEOS_FILE,
    CURVES_FILE,
    METRICS_FILE,
    STATUS_FILE,
)

log = logging.getLogger("trainer")
T = TypeVar("T")

STATUS_INTERVAL_S = 2.0
RATE_WINDOW_STEPS = 50  # "recent" clips/s and step time: over the last steps of the epoch, up to this many


def setup_logging(ctx: DistContext, log_file: Path | None, level: str) -> None:
    """Rank 0 logs at ``level`` (CONFIG.LOG.LEVEL) to the console and to ``log_file``; other ranks only warnings and
    errors (or less, at a higher level), prefixed with their rank."""
    log.handlers.clear()
    log.propagate = False
    console = logging.StreamHandler(sys.stdout if ctx.is_main else sys.stderr)
    prefix = "" if ctx.is_main else f"[rank {ctx.rank}] "
    fmt = logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(message)s", "%H:%M:%S")
    console.setFormatter(fmt)
    log.addHandler(console)
    numeric = logging.getLevelNamesMapping()[level]
    log.setLevel(numeric if ctx.is_main else max(numeric, logging.WARNING))
    if ctx.is_main and log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        to_file = logging.FileHandler(log_file)
        to_file.setFormatter(fmt)
        log.addHandler(to_file)


def write_json_atomic(path: Path, payload: dict[str, Any]) -> None:
    atomic.write(path, json.dumps(payload))  # a poller never reads half a file


def write_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Replace a metrics.jsonl with ``records``, atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write(path, "".join(json.dumps(record) + "\n" for record in records))


def attempt_from_env() -> dict[str, Any] | None:
    """The node supervisor's account of the attempt it starts ($VIDCLUSTER_ATTEMPT, a JSON object of
    ATTEMPT_FIELDS), None when it is not set (a first start, a run by hand)."""
    text = os.environ.get(ATTEMPT_ENV)
    if not text:
        return None
    try:
        attempt = json.loads(text)
    except ValueError as exc:
        raise UserError(f"{ATTEMPT_ENV}: not JSON ({exc})") from None
    problems = [f"{key} ({' or '.join(t.__name__ for t in types)})" for key, types in ATTEMPT_FIELDS.items()
                if not isinstance(attempt, dict) or not isinstance(attempt.get(key, ...), types)
                or isinstance(attempt.get(key), bool)]
    if problems:
        raise UserError(f"{ATTEMPT_ENV}: {text!r} lacks or mistypes {', '.join(problems)}")
    return attempt


def attempt_record(attempt: dict[str, Any], resumed_step: int, first_step_at: float, resumed_from: str = ""
                   ) -> dict[str, Any]:
    """metrics.jsonl's record of a restarted attempt, once its first optimizer step is done: what failed, where,
    how long the failure took to notice (detect_s) and training to resume (restart_s: from detection to that first
    step, unix time: the node clocks must agree), and the steps trained again (null when the failed step is not
    known). The failed step is the last one rank 0 had reported when the hub named the failure; after a stop where
    every rank checkpointed at its next step (a preemption, a straggler's swap) the attempt resumes past it, and
    nothing was trained twice. ``resumed_from``: "memory" when every rank went on from the step it or a peer held in
    memory (no checkpoint loaded: trainer.continuation.shared_memory), else the checkpoint file's name ("" a fresh
    start)."""
    failed = attempt["failed_step"]
    return {"attempt": attempt["attempt"], "cause": attempt["cause"], "node": attempt["node"],
            "detect_s": attempt["detect_s"], "restart_s": round(first_step_at - attempt["detected_at"], 3),
            "resumed_step": resumed_step, "resumed_from": resumed_from,
            "steps_lost": None if failed is None else max(0, failed - resumed_step)}


class Reporter:
    """Rank 0's files, and a checkpoint writer's metrics.jsonl: every method is a no-op where it has nothing to do, so
    callers need no rank checks. ``total_steps``: optimizer steps of the whole run (the ETA's)."""

    def __init__(
        self, ctx: DistContext, run_dir: Path, tb_dir: Path, epochs: int, total_steps: int, writes_metrics: bool
    ) -> None:
        self.enabled = ctx.is_main
        self.writes_metrics = writes_metrics
        self.run_dir = run_dir
        self.total_steps = total_steps
        self._recent: collections.deque[tuple[float, int]] = collections.deque(maxlen=RATE_WINDOW_STEPS + 1)
        metrics_path = run_dir / METRICS_FILE
        self.status: dict[str, Any] = {
            "state": "starting",
            "epoch": 0,
            "epochs": epochs,
            "step": 0,
            "steps_per_epoch": 0,
            "metrics": {},
            "world_size": ctx.world_size,
            "pid": os.getpid(),
            "message": "",
            "attempts": [],  # rank 0: the run's restarted attempts so far, from its metrics.jsonl
        }
        self._last_status_write = 0.0
        self.writer = None
        if self.writes_metrics:
            run_dir.mkdir(parents=True, exist_ok=True)
        if self.enabled:
            from torch.utils.tensorboard import SummaryWriter

            if metrics_path.is_file():
                self.status["attempts"] = [r for r in read_records(metrics_path) if "epoch" not in r]
            self.writer = SummaryWriter(log_dir=str(tb_dir))
            self.update_status(force=True)

    def update_status(self, force: bool = False, **fields: Any) -> None:
        self.status.update(fields)
        now = time.time()
        if not self.enabled or (not force and now - self._last_status_write < STATUS_INTERVAL_S):
            return
        self.status["updated"] = now
        write_json_atomic(self.run_dir / STATUS_FILE, self.status)
        self._last_status_write = now

    def scalar(self, tag: str, value: float, step: int) -> None:
        if self.writer is not None:
            self.writer.add_scalar(tag, value, step)

    def step_done(self, step: int, clips: int, lr: float) -> None:
        """After optimizer ``step``, which trained ``clips`` clips on all ranks: rates and ETA in the status."""
        if not self.enabled:
            return
        self._recent.append((time.monotonic(), clips))
        fields: dict[str, Any] = {"state": "running", "step": step, "lr": lr}
        if len(self._recent) > 1:
            elapsed = max(self._recent[-1][0] - self._recent[0][0], 1e-9)
            step_s = elapsed / (len(self._recent) - 1)
            fields.update(clips_per_s=round(sum(c for _, c in list(self._recent)[1:]) / elapsed, 2),
                          step_time_s=round(step_s, 4), eta_s=round(max(self.total_steps - step, 0) * step_s, 1))
        self.update_status(**fields)

    def add_record(self, record: dict[str, Any]) -> None:
        """Append a record to metrics.jsonl (where this process keeps one)."""
        if self.writes_metrics:
            with (self.run_dir / METRICS_FILE).open("a") as handle:
                handle.write(json.dumps(record) + "\n")

    def bad_videos(self, record: list[list[str]]) -> None:
        """Replace bad_videos.json with the run's record ([[path, reason], ...]), where metrics.jsonl is kept."""
        if self.writes_metrics:
            write_json_atomic(self.run_dir / BAD_VIDEOS_FILE,
                              {"count": len(record), "videos": [{"path": p, "reason": r} for p, r in record]})

    def attempt(self, record: dict[str, Any]) -> None:
        """A restarted attempt's record: in metrics.jsonl and the status file's "attempts"."""
        self.add_record(record)
        self.update_status(force=True, attempts=[*self.status["attempts"], record])

    def epoch_end(self, epoch: int, metrics: dict[str, Any]) -> None:
        """Append the epoch's metrics to metrics.jsonl and TensorBoard, and publish them in the status file."""
        record = {"epoch": epoch, **metrics}
        self.add_record(record)
        self._recent.clear()  # the next step's time would include the evaluation
        if not self.enabled:
            return
        for key, value in metrics.items():
            if isinstance(value, int | float):
                self.scalar(f"epoch/{key}", value, epoch)
        self.update_status(force=True, epoch=epoch, metrics=record)

    def close(self, state: str, message: str = "", **fields: Any) -> None:
        if not self.enabled:
            return
        if self.writer is not None:
            self.writer.close()
        metrics_path = self.run_dir / METRICS_FILE
        if state == "finished" and metrics_path.exists():
            plot_curves(metrics_path, self.run_dir / CURVES_FILE)
        self.update_status(force=True, state=state, message=message, eta_s=None, **fields)


def progress(ctx: DistContext, iterable: Iterable[T], total: int, desc: str) -> Iterator[T]:
    """Wrap a loader in a rank-0 progress bar that shows clips/s and the share of time spent waiting for data."""
    bar = tqdm(
        total=total,
        desc=desc,
        disable=not ctx.is_main,
        dynamic_ncols=True,
        mininterval=1.0 if sys.stdout.isatty() else 15.0,
        file=sys.stdout,
    )
    waited = clips = 0.0
    start = tick = time.perf_counter()
    try:
        for item in iterable:
            now = time.perf_counter()
            waited += now - tick
            yield item
            tick = time.perf_counter()
            if isinstance(item, dict) and "label" in item:
                clips += len(item["label"]) * ctx.world_size
            elapsed = max(tick - start, 1e-9)
            bar.set_postfix(clips_s=f"{clips / elapsed:.1f}", data_wait=f"{100 * waited / elapsed:.0f}%", refresh=False)
            bar.update(1)
    finally:
        bar.close()


def read_records(path: Path) -> list[dict[str, Any]]:
    """Every record of a metrics.jsonl: epochs and attempts."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The epoch records of a metrics.jsonl (those with an "epoch")."""
    return [record for record in read_records(path) if "epoch" in record]


def plot_curves(metrics_path: Path, out_png: Path) -> None:
    """Loss and top-1 accuracy per epoch, train and validation, as one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric in ((ax_loss, "loss"), (ax_acc, "top1")):
        for split in ("train", "val"):
            points = [(r["epoch"], r[f"{split}_{metric}"]) for r in records if f"{split}_{metric}" in r]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=split)
        ax.set_xlabel("epoch")
        ax.set_title("loss" if metric == "loss" else "top-1 accuracy (%)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_png, dpi=80)
    plt.close(fig)
