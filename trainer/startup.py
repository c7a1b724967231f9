"""A training process's imports: torch, torchvision and the models leave about 570,000 objects that live as long as the
process. Python's cyclic collector, left on while they load, walks the growing heap again and again: ``python -m
trainer.train --help`` took 3.4-3.7 CPU-seconds here with it on, 2.6-2.9 with it paused, a cost every training
process, standby and spawned worker pays at each (re)start. ``collector_paused`` keeps it off while they load and then
freezes what they left (``gc.freeze``: out of every later collection, as trainer.train.main and the spawned workers
did after their imports already). The garbage frozen with the imports is about 15,000 blocks, a megabyte or two.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off inside; what was made inside frozen at the end; the collector left as it was."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_on:
            gc.enable()
