"""The torch releases the trainer runs on differ here, and only here: the pinned torch (requirements.txt) and the
torch a GPU image brings with it (2.11 and later: ``scripts/gpu-check.sh`` runs there, as a user's node may).

Each difference is one name, chosen once at import from what the installed torch offers, never from its version
string.
"""

from __future__ import annotations

import inspect

from torch.nn.parallel import DistributedDataParallel

# DDP without a broadcast of rank 0's buffers before every forward. torch 2.13 renamed the switch to
# forward_sync_buffers (broadcast_buffers is deprecated there); before 2.13 broadcast_buffers=False also skips the one
# broadcast when DDP is built, which changes nothing for us: every rank builds, or loads, the same buffers.
DDP_NO_FORWARD_BUFFER_SYNC: dict[str, bool] = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters
    else {"broadcast_buffers": False}
)
