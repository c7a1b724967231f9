"""What the readiness check (playbooks/check-cluster.yml, roles/cluster_check) decodes on every node, read from an
experiment config with the trainer's own schema (on the controller):

    python -m trainer.readiness --config-file configs/slowfast.yaml

Prints one JSON object: ``decoder`` (CONFIG.DATA.DECODER), ``data_path`` (CONFIG.DATA.TRAIN_DATA_PATH, the staged
videos; a path in the controller's home is written with "~", each node's own home, as the launch renders it),
``clip_len``, ``frame_rate``, the decode size ``height`` x ``width`` (NEW_HEIGHT x NEW_WIDTH) and ``time_limit``
(DECODE_TIME_LIMIT: seconds each clip may take, as in training). A config the trainer rejects is one line on stderr and
exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from trainer.config import Config, ConfigError, load_config


def node_path(path: str) -> str:
    """``path`` as every node reads it: "~" for the controller's home (load_config expanded it here)."""
    home = Path.home()
    found = Path(path)
    return f"~/{found.relative_to(home)}" if found.is_relative_to(home) and found != home else path


def decode_settings(cfg: Config) -> dict[str, Any]:
    data = cfg.CONFIG.DATA
    return {"decoder": data.DECODER, "data_path": node_path(data.TRAIN_DATA_PATH), "clip_len": data.CLIP_LEN,
            "frame_rate": data.FRAME_RATE, "height": data.NEW_HEIGHT, "width": data.NEW_WIDTH,
            "time_limit": data.DECODE_TIME_LIMIT}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config-file", required=True)
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config_file)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(decode_settings(cfg)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
