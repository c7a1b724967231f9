"""GluonCV tutorial entry point, kept so its commands work unchanged:

    python test_ddp_pytorch.py --config-file ./configuration/i3d_resnet50_v1_kinetics400.yaml
    python -m torch.distributed.launch --nproc_per_node=8 test_ddp_pytorch.py --config-file CONFIG.yaml

It is trainer.test; see that module for the options.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, which holds `trainer`

from trainer.test import main

if __name__ == "__main__":
    main()
