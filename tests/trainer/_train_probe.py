"""Watch a real training run from outside the trainer, through torch's global hooks only (no trainer internals).

``observing()`` records, while it is open:

* ``train_forwards``: forwards of the DDP-wrapped model in train mode (one per micro-batch);
* ``grad_syncs``: gradient all-reduces DDP ran (a comm hook registered on the DDP module at its first forward counts
  each synchronised backward once, by its bucket 0), and ``find_unused_parameters`` of that DDP module;
* ``initial``: the model's weights at its first training forward, before any optimizer step;
* ``losses``: (logits, labels, loss) of every training loss (``nn.CrossEntropyLoss`` with mean
  reduction; evaluation sums);
* ``steps``: each optimizer step's learning rates (one per parameter group) and the global norm of the gradients it
  applies (after any clipping).

``probed_train_worker`` is ``trainer.train.train_worker`` under ``observing()``, for ``launch()`` to spawn: each rank
saves its record as ``probe_rank<rank>.pt`` in the run directory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_pre_hook

from trainer.config import Config, run_dir
from trainer.distributed import DistContext
from trainer.train import train_worker


@contextlib.contextmanager
def observing() -> Iterator[dict[str, Any]]:
    record: dict[str, Any] = {"train_forwards": 0, "grad_syncs": 0, "find_unused_parameters": None, "initial": None,
                              "losses": [], "steps": []}

    # DDP checks the hook's annotations against the real classes, which string annotations are not.
    def count_sync(state, bucket):  # type: ignore[no-untyped-def]
        if bucket.index() == 0:
            record["grad_syncs"] += 1
        return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]  # DDP's own averaging

    def before_forward(module: nn.Module, args: tuple[Any, ...]) -> None:
        if isinstance(module, DistributedDataParallel) and module.training:
            if record["initial"] is None:
                record["initial"] = {k: v.detach().clone() for k, v in module.module.state_dict().items()}
                record["find_unused_parameters"] = module.find_unused_parameters
                module.register_comm_hook(None, count_sync)
            record["train_forwards"] += 1

    def after_forward(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        if isinstance(module, nn.CrossEntropyLoss) and module.reduction == "mean":
            logits, labels = args
            record["losses"].append((logits.detach().double(), labels.detach().clone(), output.item()))

    def before_step(optimizer: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        record["steps"].append({"lrs": [group["lr"] for group in optimizer.param_groups],
                                "grad_norm": torch.linalg.vector_norm(torch.stack(
                                    [torch.linalg.vector_norm(g.double()) for g in grads])).item()})

    handles = [register_module_forward_pre_hook(before_forward), register_module_forward_hook(after_forward),
               register_optimizer_step_pre_hook(before_step)]
    try:
        yield record
    finally:
        for handle in handles:
            handle.remove()


def probed_train_worker(ctx: DistContext, cfg: Config) -> None:
    with observing() as record:
        train_worker(ctx, cfg)
    torch.save(record, run_dir(cfg) / f"probe_rank{ctx.rank}.pt")
