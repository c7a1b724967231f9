"""On PYTHONPATH (tests/trainer/_hanging_decoder.hanging_env) of a trainer run: every Python process the run starts
(the training processes, their spawned DataLoader workers, the decoding helpers) reads with the hanging decoder."""

import os

if os.environ.get("VCT_HANGING_VIDEO"):
    from tests.trainer._hanging_decoder import install

    install()
