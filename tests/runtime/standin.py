"""A stand-in trainer for the runtime's tests: what a node's supervisor sees of the real one (trainer.train), in a
tenth of a second per step and no torch.

    python standin.py --config-file FILE [DDP_CONFIG.WORLD_RANK R DDP_CONFIG.DIST_URL U DDP_CONFIG.WOLRD_URLS [...]]

It beats (trainer.heartbeat), steps every STANDIN_STEP_S seconds up to STANDIN_STEPS (a restarted attempt:
STANDIN_MORE_STEPS past the step it resumed from, so a test waits for detection, not for training), and keeps the real
trainer's contract (trainer.runtime.contract): rank 0 writes status.json at every step; rank 0 and the node that keeps
the second copy write a checkpoint (``ckpt.json``: its step) every STANDIN_CKPT_STEPS steps in their own run directory
(STANDIN_RUN_DIR); a restarted attempt resumes from the checkpoint in its node's run directory, and rank 0 records in
``attempts.jsonl`` what the supervisor told it ($VIDCLUSTER_ATTEMPT), the step it resumed from, the copy it read and
the steps lost. SIGUSR1 (a user's stop, a preemption: the supervisor passes it on) checkpoints the current step and
exits 75; SIGTERM (the attempt is over: the real trainer has lost its peers by then) exits 1 with no checkpoint; the
end exits 0.
STANDIN_EXIT="ATTEMPT:STEP:RC" makes attempt ATTEMPT exit with status RC at step STEP (its status.json says it failed,
with a traceback's last line, as the real one does).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType

from trainer.heartbeat import start_heartbeat
from trainer.runtime.contract import ATTEMPT_ENV, COPY_NODE_RANK, EXIT_PREEMPTED, STATUS_FILE, TRAINER_ENV

STEPS_PER_EPOCH = 10


def write(path: Path, payload: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


class StandIn:
    def __init__(self, argv: list[str]) -> None:
        self.rank = int(argv[argv.index("DDP_CONFIG.WORLD_RANK") + 1]) if "DDP_CONFIG.WORLD_RANK" in argv else 0
        self.run = Path(os.environ["STANDIN_RUN_DIR"])
        self.run.mkdir(parents=True, exist_ok=True)
        self.steps = int(os.environ.get("STANDIN_STEPS", "40"))
        self.step_s = float(os.environ.get("STANDIN_STEP_S", "0.1"))
        self.every = int(os.environ.get("STANDIN_CKPT_STEPS", "5"))
        self.attempt = int(os.environ.get(TRAINER_ENV, "0"))
        self.ckpt = self.run / "ckpt.json"
        saved = json.loads(self.ckpt.read_text()) if self.ckpt.is_file() else {"step": 0}
        self.resumed = int(saved["step"])
        self.step = self.resumed
        if self.attempt > 0:
            self.steps = self.resumed + int(os.environ.get("STANDIN_MORE_STEPS", "10"))

    def status(self, state: str, message: str = "") -> None:
        if self.rank == 0:
            write(self.run / STATUS_FILE, {"state": state, "step": self.step, "epoch": self.step // STEPS_PER_EPOCH,
                                           "epochs": -(-self.steps // STEPS_PER_EPOCH),
                                           "steps_per_epoch": STEPS_PER_EPOCH, "message": message})

    def checkpoint(self) -> None:
        if self.rank in (0, COPY_NODE_RANK):
            write(self.ckpt, {"step": self.step})

    def record_attempt(self) -> None:
        told = os.environ.get(ATTEMPT_ENV)
        if self.rank != 0 or not told:
            return
        attempt = json.loads(told)
        lost = None if attempt["failed_step"] is None else attempt["failed_step"] - self.resumed
        entry = {**attempt, "resumed_step": self.resumed, "steps_lost": lost,
                 "read": str(self.ckpt) if self.resumed else None}
        with (self.run / "attempts.jsonl").open("a") as handle:
            handle.write(json.dumps(entry) + "\n")

    def preempted(self, signum: int, frame: FrameType | None) -> None:
        self.checkpoint()
        self.status("preempted", f"stopped at step {self.step} on signal {signum}")
        sys.exit(EXIT_PREEMPTED)

    def lost_peers(self, signum: int, frame: FrameType | None) -> None:
        self.status("failed", "RuntimeError: Connection closed by peer")
        sys.exit(1)

    def main(self) -> int:
        signal.signal(signal.SIGTERM, self.lost_peers)
        signal.signal(signal.SIGUSR1, self.preempted)
        start_heartbeat()
        planned = os.environ.get("STANDIN_EXIT", "")
        fail_attempt, fail_step, fail_rc = (int(x) for x in planned.split(":")) if planned else (-1, -1, 0)
        self.status("running")
        while self.step < self.steps:
            time.sleep(self.step_s)
            self.step += 1
            if self.step == self.resumed + 1:
                self.record_attempt()
            if self.step % self.every == 0:
                self.checkpoint()
            self.status("running")
            if self.attempt == fail_attempt and self.step == fail_step:
                self.status("failed", "RuntimeError: [../third_party/gloo/...] Connection closed by peer GLHF!")
                return fail_rc
        self.checkpoint()
        self.status("finished")
        return 0


if __name__ == "__main__":
    sys.exit(StandIn(sys.argv).main())
