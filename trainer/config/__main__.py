"""``python -m trainer.config``: validate a config and print it resolved, or describe the schema.

Validate a node's file (what the Ansible launcher runs; exit status 2 on an error)::

    python -m trainer.config --config-file node.yaml --check                       # on the node itself
    python -m trainer.config --config-file node.yaml --check --no-runtime-checks   # on a controller without GPUs
    python -m trainer.config --config-file x.yaml CONFIG.TRAIN.BATCH_SIZE 16       # print the resolved YAML
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from trainer.config.files import config_to_yaml, describe_schema, load_config
from trainer.config.section import ConfigError
from trainer.node_checks import check_runtime


def get_args_parser(add_help: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.config",
        description="Validate a config and print it resolved.",
        add_help=add_help,
    )
    parser.add_argument("--config-file", type=Path, help="experiment or node YAML (GluonCV DDP format)")
    parser.add_argument("--describe", action="store_true", help="print every key, its default and meaning (Markdown)")
    parser.add_argument("--check", action="store_true", help="print a one-line summary instead of the resolved YAML")
    parser.add_argument(
        "--no-runtime-checks",
        action="store_true",
        help="skip checks about this machine (GPU for nccl): for validating another node's file on a controller",
    )
    parser.add_argument("opts", nargs=argparse.REMAINDER, default=[], help="KEY VALUE overrides")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = get_args_parser()
    args = parser.parse_args(argv)
    if args.describe:
        print(describe_schema(), end="")
        return 0
    if args.config_file is None:
        parser.error("--config-file is required (or --describe)")
    try:
        cfg = load_config(args.config_file, args.opts)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if not args.no_runtime_checks:
            check_runtime(cfg)
    except ConfigError as exc:
        print(f"error: {args.config_file}: {exc}", file=sys.stderr)
        return 2
    ddp = cfg.DDP_CONFIG
    if args.check:
        print(
            f"ok: {args.config_file}: {ddp.WORLD_SIZE} node(s), backend {ddp.DIST_BACKEND}, "
            f"distributed {ddp.DISTRIBUTED}, rendezvous {ddp.DIST_URL}"
        )
    else:
        print(config_to_yaml(cfg), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
