"""Sizes, counts, rates and senders in words, for roles/stage_data's plan, summaries and progress lines (its filters
and its transfer action)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CONTROLLER = "controller"  # the sender of a copy the controller pushes


def human(n: float) -> str:
    """A size in decimal units, three significant digits: 0 B, 512 B, 2.05 MB, 1.07 GB."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            value = n / scale
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    return f"{int(n)} B"


def files(n: int) -> str:
    """'1 file', '500 files'."""
    return f"{n} file" if int(n) == 1 else f"{n} files"


def rate_eta(done: float, total: float, seconds: float) -> str:
    """'48.2 MB/s, ETA 12 s' from bytes done of a total after some seconds."""
    if seconds <= 0 or done <= 0:
        return "starting"
    rate = done / seconds
    left = max(total - done, 0) / rate
    eta = f"{left:.0f} s" if left < 120 else f"{left / 60:.0f} min"
    return f"{human(rate)}/s, ETA {eta}"


def sender_name(transfer: Mapping[str, Any]) -> str:
    """'controller', 'node1' (its complete copy) or 'node1:source' (the source folder on node1)."""
    origin_node = transfer["origin"] and transfer["sender"] != CONTROLLER
    return f"{transfer['sender']}:source" if origin_node else str(transfer["sender"])


