"""What a run tells the outside world, all from global rank 0.

- console + ``log.txt`` (other ranks log warnings and errors only, to their own stderr),
- a tqdm progress bar with clips/s and data-wait time,
- TensorBoard event files in ``LOG.LOG_DIR``,
- ``metrics.jsonl`` (one JSON object per epoch) and ``curves.png`` at the end,
- ``status.json``: a small file an external launcher polls (state, epoch, step, last metrics).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from tqdm import tqdm

from trainer.distributed import DistContext

log = logging.getLogger("trainer")
T = TypeVar("T")

STATUS_FILE = "status.json"
METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
STATUS_INTERVAL_S = 2.0


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
    # A poller must never read half a file: write elsewhere in the same dir, then rename over.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        json.dump(payload, handle)
    os.replace(tmp, path)


class Reporter:
    """Rank 0's files; every method is a no-op on other ranks, so callers need no rank checks."""

    def __init__(self, ctx: DistContext, run_dir: Path, tb_dir: Path, epochs: int) -> None:
        self.enabled = ctx.is_main
        self.run_dir = run_dir
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
        }
        self._last_status_write = 0.0
        self.writer = None
        if self.enabled:
            from torch.utils.tensorboard import SummaryWriter

            run_dir.mkdir(parents=True, exist_ok=True)
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

    def epoch_end(self, epoch: int, metrics: dict[str, Any]) -> None:
        """Append the epoch's metrics to metrics.jsonl and TensorBoard, and publish them in the status file."""
        if not self.enabled:
            return
        record = {"epoch": epoch, **metrics}
        with (self.run_dir / METRICS_FILE).open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        for key, value in metrics.items():
            if isinstance(value, int | float):
                self.scalar(f"epoch/{key}", value, epoch)
        self.update_status(force=True, epoch=epoch, metrics=record)

    def close(self, state: str, message: str = "") -> None:
        if not self.enabled:
            return
        if self.writer is not None:
            self.writer.close()
        metrics_path = self.run_dir / METRICS_FILE
        if state == "finished" and metrics_path.exists():
            plot_curves(metrics_path, self.run_dir / CURVES_FILE)
        self.update_status(force=True, state=state, message=message)


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


def read_metrics(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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
