"""A stand-in trainer for the runtime's tests: what a node's supervisor sees of the real one (trainer.train), in a
tenth of a second per step and no torch.

    python standin.py --config-file FILE [DDP_CONFIG.WORLD_RANK R DDP_CONFIG.DIST_URL U DDP_CONFIG.WOLRD_URLS [...]]

It beats (trainer.heartbeat), steps every STANDIN_STEP_S seconds up to STANDIN_STEPS (a restarted attempt:
STANDIN_MORE_STEPS past the step it resumed from, so a test waits for detection, not for training), and keeps the real
trainer's contract (trainer.runtime.contract): rank 0 writes status.json at every step; rank 0 and the node that keeps
the second copy write a checkpoint (``ckpt.json``: its step, and its "weights", a digest of every step trained to it)
every STANDIN_CKPT_STEPS steps in their own run directory (STANDIN_RUN_DIR); a restarted attempt resumes from the
checkpoint in its node's run directory, and rank 0 records in ``attempts.jsonl`` what the supervisor told it
($VIDCLUSTER_ATTEMPT), the step it resumed from, the copy it read, the steps lost, and how it started. The end writes
the final "weights" (``weights.json``). SIGUSR1 (a user's stop, a preemption: the supervisor passes it on) checkpoints
the current step and exits 75; SIGTERM (the attempt is over: the real trainer has lost its peers by then) exits 1 with
no checkpoint; the end exits 0.

Its peers are the stand-ins of the same attempt (STANDIN_PEERS: a folder every stand-in of the job writes its pid in):
when one is gone (not done), the others' "collective" fails at their next step, as gloo's does when a peer's
connection closes.
Restart in place, as the real trainer does it (trainer.inplace, trainer.timeline: the same channel, the same code): it
reports its phases and state in the channel, a standby waits to be handed an attempt, and with $VIDCLUSTER_IN_PLACE a
stand-in that loses its peers, or is told its attempt is over, parks and resumes from the checkpoint in the attempt
it is handed; without it, a lost peer ends it with status 1.
STANDIN_EXIT="ATTEMPT:STEP:RC" makes attempt ATTEMPT exit with status RC at step STEP (its status.json says it failed,
with a traceback's last line, as the real one does). Like the real one's data loader, it has a worker process, which
outlives it by a second when it is killed.
Its steps go through the real step clock (trainer/pace.py) into its heartbeat, as data-parallel steps would: each step
computes for STANDIN_STEP_S, then waits for the slowest node of the attempt. STANDIN_SLOW names a JSON file a test may
write at any time, ``{"ip": IP, "factor": F}``: the node at IP computes F times as long, so every node of an attempt
with it takes F times as long per step, and the others wait in the all-reduce (a straggler).
Its heartbeat says where it is (trainer.heartbeat.at, .stepped: compute, then the gradient all-reduce, then data).
STANDIN_HANG="ATTEMPT:STEP:RANK" hangs rank RANK of attempt ATTEMPT in its compute of step STEP, as a rank stuck in
native code: its main thread never comes back and ignores stop signals, its heartbeat thread beats on; every other rank
of the attempt waits for it in that step's all-reduce until it is gone (then their collective fails, as gloo's does).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import FrameType

from trainer.errors import ignore_stop_signals
from trainer.heartbeat import GRADIENTS, at, measure, start_heartbeat, stepped
from trainer.inplace import InPlace, LeftAttempt, ParentGone, standby_argv
from trainer.pace import StepClock
from trainer.runtime.contract import ATTEMPT_ENV, COPY_NODE_RANK, EXIT_PREEMPTED, STATUS_FILE, TRAINER_ENV
from trainer.runtime.host.channel import ProcState
from trainer.runtime.watch.messages import COMPUTE, DATA
from trainer.timeline import PROCESS

STEPS_PER_EPOCH = 10
# A peer's file once it has left its attempt, trained it to the end, or stopped with the others on a stop signal.
LEFT, DONE, STOPPED = "left", "done", "stopped"
# The loader worker: it ends a second after its parent (a real one notices its parent's end at its next poll).
WORKER = "import os, time\nparent = os.getppid()\nwhile os.getppid() == parent:\n    time.sleep(0.05)\ntime.sleep(1)"


def write(path: Path, payload: dict[str, object]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def trained(weights: str, step: int) -> str:
    """The "weights" after one more step: they depend on every step trained, in order, and on nothing else."""
    return hashlib.sha256(f"{weights}/{step}".encode()).hexdigest()


class LostPeers(Exception):
    pass


class StandIn:
    def __init__(self, argv: list[str]) -> None:
        self.run = Path(os.environ["STANDIN_RUN_DIR"])
        self.run.mkdir(parents=True, exist_ok=True)
        self.peers = Path(os.environ["STANDIN_PEERS"]) if os.environ.get("STANDIN_PEERS") else None
        self.step_s = float(os.environ.get("STANDIN_STEP_S", "0.1"))
        self.every = int(os.environ.get("STANDIN_CKPT_STEPS", "5"))
        self.ckpt = self.run / "ckpt.json"
        self.place = InPlace.from_env()
        self.how = "process"
        signal.signal(signal.SIGTERM, self.lost_peers)
        signal.signal(signal.SIGUSR1, self.preempted)
        self.worker = subprocess.Popen([sys.executable, "-c", WORKER])
        self.begin(argv)

    def begin(self, argv: list[str]) -> None:
        """The attempt this process trains now: its rank and number, from the checkpoint on."""
        self.rank = int(argv[argv.index("DDP_CONFIG.WORLD_RANK") + 1]) if "DDP_CONFIG.WORLD_RANK" in argv else 0
        self.attempt = int(os.environ.get(TRAINER_ENV, "0"))
        self.urls = json.loads(argv[argv.index("DDP_CONFIG.WOLRD_URLS") + 1]) if "DDP_CONFIG.WOLRD_URLS" in argv else []
        world = len(self.urls) or 1
        PROCESS.set(ProcState.TRAINING, self.rank)
        if self.peers is not None:  # the "group" forms once every rank of the attempt is there
            (self.peers / f"{self.attempt}.{self.rank}").write_text(str(os.getpid()))
            while len(list(self.peers.glob(f"{self.attempt}.*"))) < world:
                time.sleep(0.02)
        PROCESS.mark("group")
        saved = json.loads(self.ckpt.read_text()) if self.ckpt.is_file() else {"step": 0, "weights": ""}
        self.resumed, self.weights = int(saved["step"]), str(saved["weights"])
        self.step = self.resumed
        PROCESS.mark("checkpoint")
        self.steps = int(os.environ.get("STANDIN_STEPS", "40"))
        if self.attempt > 0:
            self.steps = self.resumed + int(os.environ.get("STANDIN_MORE_STEPS", "10"))
        self.clock = StepClock(None, start_step=self.resumed, checkpoint_every_s=0.0)

    def factors(self) -> tuple[float, float]:
        """(this node's compute factor, the attempt's step factor): STANDIN_SLOW's straggler, if in this attempt."""
        try:
            slow = json.loads(Path(os.environ.get("STANDIN_SLOW", "")).read_text())
        except (OSError, ValueError):
            return 1.0, 1.0
        if slow["ip"] not in self.urls:
            return 1.0, 1.0
        mine = self.urls[self.rank] == slow["ip"] if self.rank < len(self.urls) else False
        return (float(slow["factor"]) if mine else 1.0), float(slow["factor"])

    def train_step(self) -> None:
        """One step through the step clock: compute, then wait for the attempt's slowest node."""
        own, slowest = self.factors()
        self.clock.batch_ready()
        at(COMPUTE)
        hung = self.hung_rank()
        if hung == self.rank:
            ignore_stop_signals()  # stuck in native code: no stop signal is acted on
            while True:
                time.sleep(1)
        time.sleep(self.step_s * own)
        self.clock.backward_done()
        at(GRADIENTS)
        with self.clock.waiting():
            time.sleep(self.step_s * (slowest - own))
            while hung is not None:  # the all-reduce waits for the hung rank, until its connection closes
                self.check_peers()
                time.sleep(0.02)
        self.check_peers()
        self.step += 1
        self.weights = trained(self.weights, self.step)
        if self.step % self.every == 0:
            with self.clock.stalled():
                self.checkpoint()
        self.clock.step_done()
        stepped()
        at(DATA)

    def hung_rank(self) -> int | None:
        """The rank STANDIN_HANG hangs in this step of this attempt, if any."""
        planned = os.environ.get("STANDIN_HANG", "")
        attempt, step, rank = (int(x) for x in planned.split(":")) if planned else (-1, -1, -1)
        return rank if (self.attempt, self.step + 1) == (attempt, step) else None

    def status(self, state: str, message: str = "") -> None:
        if self.rank == 0:
            write(self.run / STATUS_FILE, {"state": state, "step": self.step, "epoch": self.step // STEPS_PER_EPOCH,
                                           "epochs": -(-self.steps // STEPS_PER_EPOCH),
                                           "steps_per_epoch": STEPS_PER_EPOCH, "message": message})

    def checkpoint(self) -> None:
        if self.rank in (0, COPY_NODE_RANK):
            write(self.ckpt, {"step": self.step, "weights": self.weights})

    def record_attempt(self) -> None:
        told = os.environ.get(ATTEMPT_ENV)
        if self.rank != 0 or not told:
            return
        attempt = json.loads(told)
        lost = None if attempt["failed_step"] is None else attempt["failed_step"] - self.resumed
        entry = {**attempt, "resumed_step": self.resumed, "steps_lost": lost,
                 "read": str(self.ckpt) if self.resumed else None, "how": self.how}
        with (self.run / "attempts.jsonl").open("a") as handle:
            handle.write(json.dumps(entry) + "\n")

    def check_peers(self) -> None:
        """The "collective" of a step: it fails when a peer of this attempt is gone."""
        if self.peers is None:
            return
        for peer in self.peers.glob(f"{self.attempt}.*"):
            pid = peer.read_text()
            if pid == STOPPED:  # the real trainer's ranks agree on a stop at one step: all checkpoint and stop
                self.preempted(signal.SIGUSR1, None)
            if pid == LEFT or (pid.isdigit() and not Path(f"/proc/{pid}").exists()):
                raise LostPeers(f"rank {peer.name.split('.')[1]} is gone")

    def preempted(self, signum: int, frame: FrameType | None) -> None:
        ignore_stop_signals()  # as the real trainer does once it stops
        if self.peers is not None:
            (self.peers / f"{self.attempt}.{self.rank}").write_text(STOPPED)
        self.checkpoint()
        self.status("preempted", f"stopped at step {self.step} on signal {signum}")
        sys.exit(EXIT_PREEMPTED)

    def lost_peers(self, signum: int, frame: FrameType | None) -> None:
        self.status("failed", "RuntimeError: Connection closed by peer")
        sys.exit(1)

    def train(self) -> int:
        planned = os.environ.get("STANDIN_EXIT", "")
        fail_attempt, fail_step, fail_rc = (int(x) for x in planned.split(":")) if planned else (-1, -1, 0)
        self.status("running")
        while self.step < self.steps:
            self.train_step()
            if self.step == self.resumed + 1:
                PROCESS.mark("first_step")
                self.record_attempt()
            self.status("running")
            if self.attempt == fail_attempt and self.step == fail_step:
                self.status("failed", "RuntimeError: [../third_party/gloo/...] Connection closed by peer GLHF!")
                return fail_rc
            if self.place is not None:
                self.place.check(self.attempt)
        self.checkpoint()
        if self.peers is not None:  # the real run's last collective ends on every rank together
            (self.peers / f"{self.attempt}.{self.rank}").write_text(DONE)
        write(self.run / "weights.json", {"rank": self.rank, "step": self.step, "weights": self.weights})
        self.status("finished")
        return 0

    def main(self) -> int:
        start_heartbeat()
        measure(lambda: self.clock.effort)  # the current attempt's clock (begin makes one per attempt)
        while True:
            try:
                return self.train()
            except (LostPeers, LeftAttempt) as exc:
                if self.place is None:
                    self.status("failed", f"RuntimeError: Connection closed by peer ({exc})")
                    return 1
            if self.peers is not None:  # its "group" torn down: the peers' next collective fails
                (self.peers / f"{self.attempt}.{self.rank}").write_text(LEFT)
            try:
                join = self.place.next_attempt(self.attempt, lambda: False)
            except ParentGone:
                return 1
            self.how = "in place"
            self.begin(join.overrides())


if __name__ == "__main__":
    argv = standby_argv(sys.argv[1:])
    how = "standby" if "DDP_CONFIG.WORLD_RANK" in argv and "DDP_CONFIG.WORLD_RANK" not in sys.argv else "process"
    PROCESS.mark("imported")
    stand_in = StandIn(argv)
    stand_in.how = how
    sys.exit(stand_in.main())
