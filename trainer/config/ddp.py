"""DDP_CONFIG: nodes, ranks and the rendezvous (GluonCV's keys), and the rules across them."""

from __future__ import annotations

import ipaddress
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, model_validator

from trainer.config.section import URLS_ALIAS, URLS_KEY, _changed, _key_error, _Section


class DDPConfig(_Section):
    AUTO_RANK_MATCH: bool = Field(
        True, description="Find this node's WORLD_RANK by matching its addresses to WOLRD_URLS."
    )
    WORLD_SIZE: int = Field(1, ge=1, description="Number of nodes (machines) in the job.")
    WORLD_RANK: int = Field(
        0,
        ge=0,
        description="Rank of this node; 0 hosts the rendezvous. With AUTO_RANK_MATCH, 0 or the rank it finds.",
    )
    GPU_WORLD_SIZE: int = Field(
        8, ge=1, description="Total worker processes; recomputed at launch, never read from here."
    )
    GPU_WORLD_RANK: int = Field(
        0, ge=0, description="Global rank of a worker; recomputed at launch, never read from here."
    )
    DIST_URL: str = Field("tcp://127.0.0.1:10001", description="Rendezvous tcp://host:port; host is WOLRD_URLS[0].")
    WOLRD_URLS: list[str] = Field(
        default_factory=lambda: ["127.0.0.1"],
        validation_alias=AliasChoices(URLS_KEY, URLS_ALIAS),
        description="One address per node in node-rank order (GluonCV spelling; WORLD_URLS is accepted).",
    )
    DIST_BACKEND: Literal["nccl", "gloo"] = Field("nccl", description="Collective backend: nccl (GPUs) or gloo (CPUs).")
    GPU: int = Field(
        0,
        ge=0,
        description="Device index of a worker on its node; set at launch (the device if not DISTRIBUTED).",
    )
    DISTRIBUTED: bool = Field(
        True, description="Use DistributedDataParallel; False trains in one process, no collectives."
    )
    CPU_WORKERS: int = Field(1, ge=1, description="Worker processes per node on a node without GPUs (gloo).")
    TIMEOUT_SECONDS: int = Field(
        300, ge=1, description="Rendezvous and collective timeout; a missing peer fails the run."
    )
    SHARDING: Literal["ddp", "fsdp2"] = Field(
        "ddp",
        description="ddp: every rank holds the whole model (DistributedDataParallel); fsdp2: parameters, gradients "
        "and optimizer state sharded over the ranks (FSDP2, per transformer block; trainer/sharding.py).",
    )
    FSDP_PARAM_DTYPE: Literal["bfloat16", "float32"] = Field(
        "bfloat16",
        description="fsdp2: dtype of the gathered parameters the forward and backward compute in; gradients are "
        "reduced, and the sharded parameters kept, in float32.",
    )
    FSDP_ACTIVATION_CHECKPOINTING: bool = Field(
        False, description="fsdp2: recompute each transformer block's activations in the backward (less memory)."
    )

    # The keys the experiment chooses for its run, kept when a launch writes the cluster's topology into the rest.
    RUN_KEYS: ClassVar[tuple[str, ...]] = ("SHARDING", "FSDP_PARAM_DTYPE", "FSDP_ACTIVATION_CHECKPOINTING")

    @model_validator(mode="before")
    @classmethod
    def _one_spelling(cls, data: Any) -> Any:
        if isinstance(data, dict) and URLS_KEY in data and URLS_ALIAS in data:
            raise _key_error(URLS_KEY, f"also given as {URLS_ALIAS}; keep only one of the two spellings")
        return data

    def _problem(self) -> tuple[str, str] | None:
        return (_url_problem(self.DIST_URL) or (_topology_problem(self) if self.DISTRIBUTED else None)
                or _sharding_problem(self))


def _sharding_problem(ddp: DDPConfig) -> tuple[str, str] | None:
    if ddp.SHARDING == "ddp":
        for key in ("FSDP_PARAM_DTYPE", "FSDP_ACTIVATION_CHECKPOINTING"):
            if _changed(ddp, key):
                return key, "only SHARDING: fsdp2 uses it; remove it or set SHARDING: fsdp2"
    elif not ddp.DISTRIBUTED:
        return "SHARDING", "fsdp2 shards over a process group and DISTRIBUTED is False; set DISTRIBUTED: True"
    return None


def dist_url_host_port(url: str) -> tuple[str, int]:
    """Split ``tcp://host:port`` (IPv6 hosts in brackets); ValueError if it is not of that form."""
    parts = urlsplit(url)
    if parts.scheme != "tcp" or not parts.hostname or parts.port is None or parts.path not in ("", "/"):
        raise ValueError(url)
    return parts.hostname, parts.port


def _url_problem(url: str) -> tuple[str, str] | None:
    try:
        dist_url_host_port(url)
    except ValueError:
        return "DIST_URL", f"{url!r} is not tcp://host:port; write it as e.g. 'tcp://10.0.0.1:23456'"
    return None


def _same_host(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return a.lower() == b.lower()


def _topology_problem(ddp: DDPConfig) -> tuple[str, str] | None:
    urls, size = ddp.WOLRD_URLS, ddp.WORLD_SIZE
    if len(urls) != size:
        return "WORLD_SIZE", (
            f"is {size} but WOLRD_URLS lists {len(urls)} address(es); "
            f"list one address per node or set WORLD_SIZE to {len(urls)}"
        )
    host, port = dist_url_host_port(ddp.DIST_URL)
    if not _same_host(host, urls[0]):
        return "DIST_URL", (
            f"host {host} is not WOLRD_URLS[0] ({urls[0]}), the rank-0 node that hosts the rendezvous; "
            f"set DIST_URL to 'tcp://{urls[0]}:{port}' or put {host} first in WOLRD_URLS"
        )
    if size <= ddp.WORLD_RANK:
        return (
            "WORLD_RANK",
            f"is {ddp.WORLD_RANK} but WORLD_SIZE is {size}; use a node rank from 0 to {size - 1}",
        )
    if ddp.AUTO_RANK_MATCH and len(set(urls)) != len(urls):
        return (
            URLS_KEY,
            "lists an address twice, so AUTO_RANK_MATCH cannot tell the nodes apart; give each node its own",
        )
    return None
