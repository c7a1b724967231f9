"""A node's trainer as its supervisor sees it (trainer.runtime.host.node), driven directly with real processes standing
in for the trainer's: the timeline it reports keeps the phases its processes reached after they end; a trainer that dies
takes what it left running with it, and its exit is news at once; a trainer told to leave its attempt that does not
park within the stop grace is killed, and the node says why it did not go on in place. And the channel's files are
refused when another user could have written them."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.runtime.test_plan import job, plans
from trainer.runtime import layout, schema
from trainer.runtime.contract import JOB_DIR_ENV, STACKS_S, TRAINER_ENV, WHERE_SUFFIX
from trainer.runtime.host import beats as beats_module
from trainer.runtime.host import channel, procs
from trainer.runtime.host.channel import ChannelError, Notice, ProcessReport, ProcState
from trainer.runtime.host.node import Node
from trainer.runtime.job.hub import new_record
from trainer.runtime.job.pace import Beat, beat_text
from trainer.runtime.job.record import Failure, Kind, Phase, Start
from trainer.runtime.plan import NodePlan
from trainer.runtime.watch.messages import COLLECTIVE, COMPUTE, DATA, EVALUATE, TrainerState, Where

WAIT = "import time\nwhile True:\n    time.sleep(0.05)"
# A trainer stuck in its main thread (no stop signal is acted on, as in native code) that writes its stacks when asked
# (trainer.heartbeat registers the same); it says when it is ready.
STUCK = ("import faulthandler, signal, time\nfrom trainer.runtime.contract import STACKS_SIGNAL\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
         "faulthandler.register(STACKS_SIGNAL, all_threads=True)\nprint('ready', flush=True)\n"
         "def stuck():\n    while True:\n        time.sleep(0.05)\nstuck()")


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    planned = plans(job([str(tmp_path / "a"), str(tmp_path / "b")], watch={"heartbeat_timeout": 4.0,
                                                                            "stop_grace": 1.0}))["n0"]
    plan = dataclasses.replace(planned, restarts=dataclasses.replace(planned.restarts, in_place=True))
    Path(plan.paths.job_dir).mkdir(parents=True)
    said: list[str] = []
    made = Node(plan, said.append)
    made.said = said  # type: ignore[attr-defined]
    yield made
    procs.end(plan.paths.job_dir, 0.0, first=signal.SIGKILL)


def trainer_process(plan: NodePlan, code: str = WAIT, piped: bool = False) -> subprocess.Popen[bytes]:
    """A process of the job's trainer (its environment says so), doing ``code``; ``piped``: its stdout and stderr are
    pipes."""
    pipe = subprocess.PIPE if piped else None
    return subprocess.Popen([sys.executable, "-c", code], stdout=pipe, stderr=pipe,
                            env={**os.environ, JOB_DIR_ENV: plan.paths.job_dir, TRAINER_ENV: "0"})


def stuck_trainer(plan: NodePlan) -> subprocess.Popen[bytes]:
    """A trainer process (STUCK) once it is ready; its stderr is a pipe."""
    proc = trainer_process(plan, STUCK, piped=True)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    return proc


def killed_after_its_stacks(node: Node, trainer: subprocess.Popen[bytes]) -> None:
    """The node asked ``trainer`` for its stacks and kills it at its first poll STACKS_S later; they are on its
    stderr (the node's log, under the supervisor)."""
    assert trainer.poll() is None
    time.sleep(STACKS_S + 0.2)
    node.poll()  # killed now
    assert trainer.wait(10) == -signal.SIGKILL
    assert trainer.stderr is not None
    assert re.search(r'Current thread 0x[0-9a-f]+ \(most recent call first\):\n  File "<string>", line \d+ in stuck\n',
                     trainer.stderr.read().decode()), "no stacks"


def seen(node: Node, *processes: subprocess.Popen[bytes]) -> None:
    """Wait until the node can tell ``processes`` for its trainer's (a process just forked shows its parent's
    environment until it has exec'd)."""
    deadline = time.monotonic() + 30
    while not {p.pid for p in processes} <= set(procs.job_processes(node.plan.paths.job_dir, trainers_only=True)):
        assert time.monotonic() < deadline, "the trainer's processes never showed as the job's"
        time.sleep(0.05)


def begun(node: Node, proc: subprocess.Popen[bytes]) -> None:
    """The node runs ``proc`` as its trainer of attempt 0."""
    node.proc = proc
    node._begin(0, 0, Start.PROCESS, proc.pid)


def report(node: Node, pid: int, state: ProcState = ProcState.TRAINING, rank: int = 0, micro_batches: int | None = None,
           step_before: float | None = None, **phases: float) -> None:
    channel.write(Path(node.channel) / f"{pid}.json", ProcessReport(pid=pid, attempt=0, rank=rank, state=state,
                                                                  phases=phases, micro_batches=micro_batches,
                                                                  step_before=step_before))


def test_the_timeline_keeps_the_phases_and_accumulation_the_processes_said_after_a_process_ends(node: Node) -> None:
    launcher = trainer_process(node.plan)
    worker = trainer_process(node.plan)  # the process that trains, and writes its report (a spawned worker)
    seen(node, launcher, worker)
    begun(node, launcher)
    now = time.time()
    report(node, worker.pid, started=now, imported=now + 1, group=now + 2, checkpoint=now + 3)
    node.poll()
    assert node.timeline().micro_batches is None  # type: ignore[union-attr]
    report(node, worker.pid, micro_batches=2, step_before=now - 3, started=now, imported=now + 1, group=now + 2,
           checkpoint=now + 3, first_step=now + 4)
    node.poll()
    reached = node.timeline()
    assert reached is not None and reached.first_step == now + 4 and reached.start == Start.PROCESS
    assert (reached.micro_batches, reached.step_before) == (2, now - 3)
    worker.kill()
    worker.wait()
    node.poll()  # the worker is gone, with its report; the launcher still runs
    assert node.timeline() == reached


def test_a_trainer_that_dies_takes_its_workers_with_it_and_its_exit_is_news_at_once(node: Node) -> None:
    code = f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', {WAIT!r}])\ntime.sleep(30)"
    trainer = trainer_process(node.plan, code)
    begun(node, trainer)
    deadline = time.monotonic() + 30
    while len(procs.job_processes(node.plan.paths.job_dir, trainers_only=True)) < 2:  # its worker is there
        assert time.monotonic() < deadline
        time.sleep(0.05)
    trainer.kill()
    trainer.wait()
    node.poll()
    assert node.trainer.state == TrainerState.EXITED and node.trainer.rc == -9
    deadline = time.monotonic() + 5  # its worker was sent SIGKILL: it dies as soon as the kernel runs it
    while (left := procs.job_processes(node.plan.paths.job_dir, trainers_only=True)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []  # its worker went with it
    assert node.fallback == "its trainer was killed by signal 9 (SIGKILL) (attempt 0)"


# A trainer with two loader workers (trainer.data.loader: started from a fork server, their queues' locks named
# semaphores in /dev/shm, which multiprocessing's resource tracker unlinks for a process that cannot); it prints their
# names once its workers ran, then waits.
WITH_WORKERS = """
import gc, json, multiprocessing.synchronize, time
from torch.utils.data import DataLoader
from trainer.data.loader import seed_worker, worker_context

loader = DataLoader(range(8), num_workers=2, multiprocessing_context=worker_context(), worker_init_fn=seed_worker,
                    persistent_workers=True)
assert list(loader)
locks = [o for o in gc.get_objects() if isinstance(o, multiprocessing.synchronize.SemLock)]
print(json.dumps([lock._semlock.name for lock in locks]), flush=True)
while True:
    time.sleep(0.05)
"""


def test_a_trainer_killed_with_its_loader_workers_leaves_no_semaphore_behind(node: Node) -> None:
    trainer = trainer_process(node.plan, WITH_WORKERS, piped=True)
    assert trainer.stdout is not None
    names = json.loads(trainer.stdout.readline())
    files = [Path("/dev/shm") / f"sem.{name.lstrip('/')}" for name in names]
    # The workers' index queues, the result queue and the done event.
    assert len(files) >= 6 and all(f.exists() for f in files), files
    begun(node, trainer)
    node.stop("its rank hung", signal.SIGKILL)  # every process of the trainer, but the tracker (procs.signal_all)
    assert trainer.wait(10) == -signal.SIGKILL
    deadline = time.monotonic() + 20  # its workers end at their next look at their parent (every 5 s)
    while (left := procs.job_processes(node.plan.paths.job_dir, trainers_only=True)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [] and not [f for f in files if f.exists()], (left, files)


def test_a_trainer_that_does_not_leave_its_attempt_in_time_is_killed_and_the_node_says_why(node: Node) -> None:
    trainer = stuck_trainer(node.plan)  # it never reads the notice
    begun(node, trainer)
    node.leave("attempt 0 is over")
    notice = channel.read(Notice, Path(node.channel) / channel.NOTICE_FILE)
    assert notice == Notice(over=0, join=None)
    node.poll()
    assert node.trainer.state == TrainerState.RUNNING  # within the stop grace (1 s)
    time.sleep(node.plan.watch.stop_grace + 0.2)
    node.poll()  # its stacks asked for
    killed_after_its_stacks(node, trainer)
    node.poll()
    assert node.trainer.state == TrainerState.EXITED
    assert node.fallback == "its trainer did not leave its attempt within 1 s (attempt 0)"
    assert "the trainer did not leave attempt 0 within 1 s: killing it" in "\n".join(node.said)  # type: ignore
    # The attempt's record says so: the stop grace is no normal path.
    timeline = node.timeline()
    assert timeline is not None and timeline.killed == ("its trainer did not leave its attempt within the 1 s stop "
                                                        "grace: killed")


def test_a_trainer_that_ignores_its_stop_is_killed_after_the_grace_and_its_timeline_says_so(node: Node) -> None:
    trainer = stuck_trainer(node.plan)
    begun(node, trainer)
    node.stop("the job is over", signal.SIGTERM)
    node.poll()
    assert node.trainer.state == TrainerState.RUNNING and node.timeline().killed == ""  # type: ignore[union-attr]
    time.sleep(node.plan.watch.stop_grace + 0.2)
    node.poll()  # its stacks asked for
    killed_after_its_stacks(node, trainer)
    timeline = node.timeline()
    assert timeline is not None and timeline.killed == "its trainer did not stop within the 1 s stop grace: killed"


def test_a_trainer_whose_rank_the_hub_names_hung_is_killed_once_it_wrote_its_stacks(node: Node) -> None:
    trainer = stuck_trainer(node.plan)  # its main thread is stuck: it reads no notice, acts on no SIGTERM
    begun(node, trainer)
    seen(node, trainer)
    record = new_record(node.plan, time.time())
    hung = Failure("n0", Kind.HUNG, "its rank 0 hung in data, 3 steps into its attempt", time.time())
    node.reconcile(dataclasses.replace(record, phase=Phase.STOPPING, first_failure=hung))
    killed_after_its_stacks(node, trainer)  # no stop grace
    node.poll()
    assert node.trainer.state == TrainerState.EXITED and node.fallback == "its trainer hung (attempt 0)"
    assert node.timeline().killed == ""  # type: ignore[union-attr]


# A trainer that says which stop signal it got (the real one checkpoints at a common step on either, with its peers).
SAYS_ITS_SIGNAL = ("import signal, time\n"
                   "for sig in (signal.SIGTERM, signal.SIGUSR1):\n"
                   "    signal.signal(sig, lambda got, _: print(signal.Signals(got).name, flush=True))\n"
                   "print('ready', flush=True)\n"
                   "while True:\n    time.sleep(0.05)")


@pytest.mark.parametrize(("kind", "told"), [(Kind.STOPPED, "SIGUSR1"), (Kind.PREEMPTED, "SIGUSR1"),
                                             (Kind.SLOW, "SIGUSR1"), (Kind.LOST, None)])
def test_an_attempt_stopped_for_a_checkpoint_elsewhere_checkpoints_here_too_and_a_failed_one_is_left(
        node: Node, kind: Kind, told: str | None) -> None:
    # n1's trainer checkpoints at a step every rank agrees on (a user's stop, a preemption, a straggler's swap): this
    # node's trainer must be there to agree, not torn out of the attempt before it did. After a failure, it leaves.
    trainer = trainer_process(node.plan, SAYS_ITS_SIGNAL, piped=True)
    assert trainer.stdout is not None and trainer.stdout.readline() == b"ready\n"
    begun(node, trainer)
    seen(node, trainer)
    stopping = dataclasses.replace(new_record(node.plan, time.time()), phase=Phase.STOPPING,
                                   first_failure=Failure("n1", kind, "why", time.time()))
    node.reconcile(stopping)
    notice = channel.read(Notice, Path(node.channel) / channel.NOTICE_FILE)
    if told is None:
        assert notice == Notice(over=0, join=None) and node.stop_deadline is None
    else:
        assert notice is None and trainer.stdout.readline().decode().strip() == told


def test_a_trainer_that_parks_is_parked_and_the_next_attempt_is_handed_to_it(node: Node) -> None:
    trainer = trainer_process(node.plan)
    begun(node, trainer)
    node.leave("attempt 0 is over")
    report(node, trainer.pid, ProcState.PARKED, started=time.time())
    node.poll()
    assert node.trainer.state == TrainerState.PARKED and node.leave_deadline is None


def test_channel_files_that_others_may_write_are_refused(tmp_path: Path) -> None:
    folder = channel.make_folder(tmp_path / "channel")
    path = folder / channel.NOTICE_FILE
    channel.write(path, Notice(over=2, join=None))
    assert channel.read(Notice, path) == Notice(over=2, join=None) and path.stat().st_mode & 0o777 == 0o600
    path.chmod(0o622)
    with pytest.raises(ChannelError, match="may be written by other users"):
        channel.read(Notice, path)
    path.chmod(0o600)
    folder.chmod(0o770)
    with pytest.raises(ChannelError, match="may be written by other users"):
        channel.read(Notice, path)
    folder.chmod(0o700)
    os.chown(path, 65534, -1)  # another user's file (the tests run as root, which may give it away)
    with pytest.raises(ChannelError, match="belongs to uid 65534"):
        channel.read(Notice, path)
    os.chown(path, os.geteuid(), -1)
    path.write_text('{"over": "two", "join": null}')
    with pytest.raises(ChannelError, match="over: expected int"):
        channel.read(Notice, path)


def test_on_nccl_the_flight_recorder_dumps_into_the_attempts_folder_and_its_timeline_lists_the_dumps(
        tmp_path: Path) -> None:
    planned = plans(job([str(tmp_path / "a"), str(tmp_path / "b")]))["n0"]
    plan = dataclasses.replace(planned, backend="nccl", env={**planned.env, "TORCH_NCCL_TRACE_BUFFER_SIZE": "64"})
    Path(plan.paths.job_dir).mkdir(parents=True)
    node = Node(plan, lambda _line: None)
    env = node._env("3")
    folder = Path(plan.paths.job_dir) / "flight" / "3"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(folder / "rank_") and folder.is_dir()
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "64"  # the user's
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "2"  # a failed collective raises: the process can park
    node._begin(3, 0, Start.PROCESS, None)
    assert node.timeline().flight == ()  # type: ignore[union-attr]
    (folder / "rank_1").write_bytes(b"trace")
    assert node.timeline().flight == (str(folder / "rank_1"),)  # type: ignore[union-attr]
    assert "TORCH_FR_DUMP_TEMP_FILE" not in Node(planned, lambda _line: None)._env("3")  # gloo: nothing to record


def test_the_ranks_progress_goes_to_the_hub_while_they_beat_a_silent_one_is_left_to_the_heartbeat(node: Node) -> None:
    trainer = trainer_process(node.plan)
    begun(node, trainer)
    seen(node, trainer)
    report(node, trainer.pid, started=time.time())
    beats = Path(node.job_dir) / layout.HEARTBEAT_DIR
    beats.mkdir()
    now = time.monotonic()
    where = Where(step=7, phase=DATA, since=now - 3, step_at=now - 5, step_s=0.5)
    (beats / f"{trainer.pid}{WHERE_SUFFIX}").write_text(json.dumps(schema.dump(where)))
    (beats / str(trainer.pid)).write_text(beat_text(Beat(at=now, effort=None)))
    node.poll()
    [rank] = node.ranks()
    assert (rank.rank, rank.step, rank.phase, rank.step_s) == (0, 7, DATA, 0.5)
    assert 5 <= rank.stalled_s < 6 and 3 <= rank.phase_s < 4
    # Its beats stop (SIGSTOP, a hung filesystem): frozen, which its heartbeat's timeout names; not judged hung.
    (beats / str(trainer.pid)).write_text(beat_text(Beat(at=now - 3 * node.timings.report_every, effort=None)))
    assert node.ranks() == ()


def test_a_node_says_where_every_rank_is_or_none_and_reports_often_while_a_step_stalls(node: Node) -> None:
    launcher, first, second = (trainer_process(node.plan) for _ in range(3))
    seen(node, launcher, first, second)
    begun(node, launcher)
    beats = Path(node.job_dir) / layout.HEARTBEAT_DIR
    beats.mkdir()
    now = time.monotonic()
    for rank, worker, phase in ((0, first, COLLECTIVE + "gradients"), (1, second, COMPUTE)):
        report(node, worker.pid, rank=rank, started=time.time())
        where = Where(step=7, phase=phase, since=now - 1, step_at=now - 1, step_s=0.5)
        (beats / f"{worker.pid}{WHERE_SUFFIX}").write_text(json.dumps(schema.dump(where)))
        (beats / str(worker.pid)).write_text(beat_text(Beat(at=now, effort=None)))
    node.poll()
    assert sorted(r.rank for r in node.ranks()) == [0, 1] and not node.stalled()
    # Rank 1's step stalls past the watch's stall_report (rank 0 waits for it): the member reports at the waiting
    # cadence; an epoch's end, however long, is no stall.
    stall = node.timings.stall_report + 1
    for phase, stalled in ((COMPUTE, True), (EVALUATE, False)):
        where = Where(step=7, phase=phase, since=now - stall, step_at=now - stall, step_s=0.5)
        (beats / f"{second.pid}{WHERE_SUFFIX}").write_text(json.dumps(schema.dump(where)))
        (beats / f"{first.pid}{WHERE_SUFFIX}").write_text(json.dumps(schema.dump(
            dataclasses.replace(where, phase=COLLECTIVE + "gradients" if stalled else EVALUATE))))
        assert node.stalled() is stalled, phase
    # Rank 1 stops beating (frozen: its heartbeat's timeout names it): the node says where no rank is, so that rank
    # 0, which waits for it, is never judged on its own.
    (beats / str(second.pid)).write_text(beat_text(Beat(at=now - 3 * node.timings.report_every, effort=None)))
    assert node.ranks() == ()


def test_the_trainers_silence_while_its_supervisor_was_stopped_too_is_no_freeze(
        node: Node, monkeypatch: pytest.MonkeyPatch) -> None:
    # The node's machine stopped for three heartbeat timeouts (SIGSTOP on every process, a suspended VM): back, its
    # supervisor must not kill the trainer as frozen before it could beat again; silence it watched still counts.
    clock = [1000.0]
    monkeypatch.setattr(beats_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    heartbeats = beats_module.Heartbeats(node.job_dir, node.timings)
    folder = Path(node.job_dir) / layout.HEARTBEAT_DIR
    folder.mkdir()
    (folder / str(os.getpid())).write_text(beat_text(Beat(at=clock[0], effort=None)))  # a live process's beat
    loss = node.timings.loss

    def looks(seconds: float) -> None:
        """The supervisor's ticks, every 0.1 s, for ``seconds``."""
        for _ in range(round(seconds / 0.1)):
            clock[0] += 0.1
            heartbeats.looked()

    looks(1)
    clock[0] += 3 * loss  # the whole machine stopped
    looks(0.1)
    assert heartbeats.frozen() is None
    looks(loss - 0.5)
    assert heartbeats.frozen() is None  # watched for less than the timeout
    looks(1)
    frozen = heartbeats.frozen()
    assert frozen is not None and frozen[0] == os.getpid() and loss < frozen[1] < loss + 1  # watched silence counts
    # A supervisor that looked all along names a trainer silent for the timeout, as ever.
    (folder / str(os.getpid())).write_text(beat_text(Beat(at=clock[0], effort=None)))
    looks(loss + 0.5)
    assert heartbeats.frozen() is not None


def test_a_trainer_out_of_the_world_parks_in_place_and_goes_on_when_given_a_rank_again(node: Node) -> None:
    # A node back from a loss (or replaced by a spare) finds the world went on without it: its trainer leaves its
    # attempt and waits in place, ready at once (the hub grows by it); given a rank again, it goes on in place.
    trainer = trainer_process(node.plan)
    begun(node, trainer)
    launched = new_record(node.plan, time.time())
    without = dataclasses.replace(launched, attempt=1, assignment={"n1": 0})
    node.reconcile(without)
    assert channel.read(Notice, Path(node.channel) / channel.NOTICE_FILE) == Notice(over=0, join=None)
    assert node.trainer.state == TrainerState.RUNNING and not node.standby_ready()  # leaving, not stopped
    seen(node, trainer)
    report(node, trainer.pid, state=ProcState.PARKED)
    node.poll()
    node.reconcile(without)
    assert node.trainer.state == TrainerState.PARKED and node.standby_ready() and trainer.poll() is None
    node.reconcile(dataclasses.replace(launched, attempt=2, assignment={"n1": 0, "n0": 1}))
    notice = channel.read(Notice, Path(node.channel) / channel.NOTICE_FILE)
    assert notice is not None and notice.join is not None and (notice.join.attempt, notice.join.rank) == (2, 1)
    assert node.trainer.state == TrainerState.RUNNING and node.start_how == Start.IN_PLACE
