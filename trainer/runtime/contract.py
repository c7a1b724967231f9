"""What the trainer, the job runtime and the launcher agree on, written once: the trainer, the runtime and the
launcher's plugins import it from here. Standard library only, no torch, no other module of this package: the
trainer imports it without importing the runtime, the runtime without the trainer.

- the environment a node's supervisor gives its trainer (and the weights variables a site may set), and the channel
  between them (its files: trainer.runtime.host.channel);
- what the trainer's exit status tells whoever restarts it;
- the files of a run directory (LOG.BASE_PATH/EXP_NAME) and which of them the launcher collects;
- the default weights cache, the run name of ``EXP_NAME: use_time``;
- which node keeps the second copy of the checkpoints (it becomes rank 0 when the rank-0 node is replaced);
- how many threads a CPU worker gets when nobody says.

Where a job's files are on a node is trainer.runtime.layout's answer (that file runs alone on the nodes).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping

# -- the environment of a job's processes (set by the node's supervisor: trainer.runtime.host.node) --------------------
JOB_DIR_ENV = "VIDCLUSTER_JOB_DIR"  # every process of a job: its folder on the node (trainer.runtime.host.procs)
TRAINER_ENV = "VIDCLUSTER_TRAINER"  # a job's training processes: the attempt they belong to
HEARTBEAT_DIR_ENV = "VIDCLUSTER_HEARTBEAT_DIR"  # where each training process writes its heartbeat (trainer.heartbeat)
HEARTBEAT_INTERVAL_ENV = "VIDCLUSTER_HEARTBEAT_INTERVAL"  # seconds between two beats
# <pid>.where beside <pid>, the beat: where the process is (trainer.runtime.watch.messages.Where)
WHERE_SUFFIX = ".where"
ATTEMPT_ENV = "VIDCLUSTER_ATTEMPT"  # a restarted attempt: what failed before it (ATTEMPT_FIELDS, JSON)
# field -> the JSON types it may have; the supervisor writes exactly these, the trainer checks them
ATTEMPT_FIELDS: Mapping[str, tuple[type, ...]] = {
    "attempt": (int,), "cause": (str,), "node": (str,), "detected_at": (int, float), "detect_s": (int, float),
    "failed_step": (int, type(None)),
}
# The channel between a node's supervisor and its training processes (trainer.runtime.host.channel): a folder in the
# node's job folder where each training process reports its attempt, its state and when it reached each phase of the
# attempt (a benchmark may set it under torchrun: the phases are written whoever starts the trainer).
CHANNEL_ENV = "VIDCLUSTER_CHANNEL"
# "1": a training process that loses its peers, or is told its attempt is over, tears down its process group and waits
# in place for the next attempt (the supervisor's notice in the channel) instead of exiting (trainer.inplace).
IN_PLACE_ENV = "VIDCLUSTER_IN_PLACE"
# A standby (an attempt number): a trainer process that imports what it needs, then waits until its supervisor hands
# it an attempt (that one or a later one) before it reads its config (trainer.inplace).
STANDBY_ENV = "VIDCLUSTER_STANDBY"
# The pid of the process that hands this one its attempts (its supervisor; for a worker a trainer spawned, that
# trainer): a process waiting for an attempt gives up once its parent is another. Passed down rather than read with
# getppid() when the wait begins, which is after the imports: a parent that died during them would go unnoticed.
PARENT_ENV = "VIDCLUSTER_PARENT"

# On nccl: the folder of PyTorch's flight recorder dumps, one folder per attempt (``nccl_env``).
FLIGHT_ENV = "VIDCLUSTER_FLIGHT"
FLIGHT_DUMP_ENV = "TORCH_FR_DUMP_TEMP_FILE"  # torch 2.14's name (TORCH_NCCL_DEBUG_INFO_TEMP_FILE before it)
FLIGHT_ENTRIES = 2000  # collectives each process keeps in its flight recorder (TORCH_NCCL_TRACE_BUFFER_SIZE)
# torch 2.14's watchdog on a failed nccl collective: 2 (CleanUpOnly) aborts the communicator and the collective
# raises; its default, 3, ends the process, which could then not park (restart in place).
NCCL_ERROR_HANDLING_ENV, NCCL_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING", "2"

# -- weights: a site's cache, mirror and table (trainer.weights.zoo; the launcher ships the table) -----------------
WEIGHTS_CACHE_ENV = "VIDCLUSTER_WEIGHTS_CACHE"
WEIGHTS_URL_ENV = "VIDCLUSTER_WEIGHTS_URL"
WEIGHTS_ALLOW_HTTP_ENV = "VIDCLUSTER_WEIGHTS_ALLOW_HTTP"  # "1": a plain http mirror is asked for
WEIGHTS_TABLE_ENV = "VIDCLUSTER_WEIGHTS_TABLE"
WEIGHTS_CACHE = "~/.cache/vidcluster/weights"  # without $VIDCLUSTER_WEIGHTS_CACHE; "~": the node's home

# -- exit statuses (trainer.errors raises them, trainer.runtime.job.verdict reads them) --------------------------------
EXIT_REJECTED = 2  # the input is bad (config, data, weights): one `error:` line; a restart cannot fix it
EXIT_PEER_LOST = 1  # its peers are gone, its group did not form, or it is stuck in an attempt over: a restart may help
EXIT_PREEMPTED = 75  # EX_TEMPFAIL: asked to stop, every rank checkpointed at one step: start again to resume

# -- stacks: a trainer about to be killed (hung, or it would not leave its attempt) writes every thread's stack into
# its log first (trainer.heartbeat registers faulthandler for it; trainer.runtime.host.node sends it). SIGWINCH: its
# default is to be ignored, so a process that has not registered (still importing, a spawned decoder helper) goes on
# unharmed.
STACKS_SIGNAL = signal.SIGWINCH
STACKS_S = 1.0  # SIGKILL follows this long after it: faulthandler writes from its signal handler, in milliseconds

# -- the run directory (the trainer writes it; the launcher collects from it) --------------------------------------
STATUS_FILE = "status.json"  # rank 0's progress, polled by the node's supervisor
METRICS_FILE = "metrics.jsonl"
CURVES_FILE = "curves.png"
DIGEST_FILE = "weights_digest.json"
RUN_CONFIG_FILE = "config.yaml"
BAD_VIDEOS_FILE = "bad_videos.json"  # every video the run could not use, every rank's, with its reason
REQUIRED_RUN_FILES = (METRICS_FILE, STATUS_FILE)  # collecting a finished run fails without them
RUN_NAME_TIME = "%Y-%m-%d-%H-%M-%S"  # EXP_NAME use_time: the start time, as GluonCV names a run

# -- ranks -----------------------------------------------------------------------------------------------------------
COPY_NODE_RANK = 1  # the node that keeps the second copy of the checkpoints and the run's history


def run_files(log_filename: str) -> list[str]:
    """The run directory's files the launcher collects from the rank-0 node when a job ends, required ones first."""
    return [*REQUIRED_RUN_FILES, CURVES_FILE, log_filename, DIGEST_FILE, RUN_CONFIG_FILE, BAD_VIDEOS_FILE]


def run_name(when: float | None = None) -> str:
    """The run directory's name for EXP_NAME use_time, started at ``when`` (now)."""
    # Now is time.time(), not localtime()'s own now: that is C's time(), a coarse clock up to a tick behind the one
    # every other time of the run is read from, so a name could fall in the second before the run began.
    return time.strftime(RUN_NAME_TIME, time.localtime(time.time() if when is None else when))


def flight_dump(folder: str, attempt: int | str) -> str:
    """Where the processes of ``attempt`` dump their flight recorder: ``<folder>/<attempt>/rank_<rank>`` (torch
    appends the rank)."""
    return os.path.join(folder, str(attempt), "rank_")


def nccl_env(folder: str, attempt: int | str, in_place: bool) -> dict[str, str]:
    """An nccl trainer's environment: its flight recorder on, dumped on a collective's timeout or error into
    ``folder`` (its attempt's subfolder: the node keeps the dumps with the attempt's record); with restart in place,
    a failed collective aborts its communicator and raises (NCCL_ERROR_HANDLING) instead of ending the process, so
    that the process can park."""
    env = {FLIGHT_ENV: folder, FLIGHT_DUMP_ENV: flight_dump(folder, attempt),
           "TORCH_NCCL_TRACE_BUFFER_SIZE": str(FLIGHT_ENTRIES), "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
           "TORCH_NCCL_ENABLE_MONITORING": "1"}  # torch dumps on a timeout only with its monitor on
    if in_place:
        env[NCCL_ERROR_HANDLING_ENV] = NCCL_ERROR_HANDLING
    return env


def thread_budget(workers: int, cpus: int | None = None) -> int:
    """Threads per CPU worker when OMP_NUM_THREADS is not set: the node's cores shared, instead of every worker of
    the node starting one thread per core."""
    return max(1, (cpus if cpus is not None else os.cpu_count() or 1) // max(1, workers))


def copy_rank(processes_per_node: int) -> int:
    """The global rank that writes the second copy of the checkpoints: the first process of node COPY_NODE_RANK."""
    return COPY_NODE_RANK * processes_per_node
