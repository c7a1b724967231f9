"""The run's bad videos, job-wide: every rank's, every split's, each with the reason it could not be used.

Each epoch's bad videos (gathered from every rank at the epoch's end: trainer.engine.gather_bad) join the run's
record, of which every rank holds the same copy. The record is kept

- in every checkpoint (``bad_videos``), so a resumed run knows them; a mid-epoch checkpoint adds what every rank had
  found so far in its epoch (its EpochProgress);
- in the run directory, ``bad_videos.json`` (trainer.runtime.contract.BAD_VIDEOS_FILE: the launcher collects it),
  by every process that writes metrics.jsonl;
- by the datasets: a video whose decoding ran out of time is not decoded again (VideoClipDataset.skip_timed_out),
  so a hung file costs the time limit once, not once per epoch or view;

and the end of the run lists each one with its reason.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("trainer")


class BadVideos:
    """path -> reason of every bad video the run has met (the first reason a video was reported with)."""

    def __init__(self, known: Iterable[tuple[str, str]] = ()) -> None:
        self.reasons: dict[str, str] = {}
        self.add(known)

    @classmethod
    def from_checkpoint(cls, ckpt: dict[str, Any] | None) -> BadVideos:
        """What a checkpoint knows: the run's record up to its last epoch, and a mid-epoch one's partial tallies."""
        if ckpt is None:
            return cls()
        ranks = (ckpt.get("progress") or {}).get("ranks", [])
        return cls([*map(tuple, ckpt.get("bad_videos", [])),
                    *(tuple(bad) for rank in ranks for bad in rank["tally"]["bad"])])

    def add(self, bad: Iterable[tuple[str, str]]) -> None:
        for path, reason in bad:
            self.reasons.setdefault(path, reason)

    def record(self) -> list[list[str]]:
        """[[path, reason], ...] sorted by path: what checkpoints and bad_videos.json hold."""
        return [[path, self.reasons[path]] for path in sorted(self.reasons)]

    def items(self) -> list[tuple[str, str]]:
        return [(path, reason) for path, reason in self.record()]

    def report(self) -> None:
        """The end of the run's account: every bad video with its reason (rank 0 logs)."""
        if not self.reasons:
            log.info("no bad videos in this run")
            return
        log.warning("%d bad video(s) in this run, not trained or evaluated on:", len(self.reasons))
        for path, reason in self.record():
            log.warning("  %s: %s", path, reason)
