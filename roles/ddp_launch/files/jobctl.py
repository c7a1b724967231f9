"""Start, watch and stop one node's part of a training job (standard library only; runs with the node's Python).

roles/ddp_launch copies this file into the node's folder of the job and runs it there:

    jobctl.py start NODE_DIR [ROOT_WATCH]    start the node's supervisor detached (new session); pid in train.pid
    jobctl.py wait NODE_DIR SECONDS          until the job ends, a failure is recorded, or SECONDS pass; print state
    jobctl.py status NODE_DIR                print the node's state of the job (with the watch and, on rank 0, the
                                             trainer's status file)
    jobctl.py stop NODE_DIR GRACE            SIGTERM the node's job, SIGKILL after GRACE s (idempotent)
    jobctl.py settle NODE_DIR GRACE REASON   after a failure elsewhere: let the watch end the job, then stop the rest

NODE_DIR/job.json (written by the role) says what to run and who the job is: {"argv", "env", "cwd", "workers",
"node", "rank", "nodes" (names in rank order), "root_ip", "status_file", "heartbeat_timeout", "stop_grace",
"startup_timeout"}. The node's processes form one process group led by a `supervise` process of this file.

The job belongs to its nodes, not to the controller that launched it. The supervisors watch each other:
- the rank-0 supervisor listens on an ephemeral port of root_ip (written to watch.port; `start` prints it and the
  others get it as ROOT_WATCH); every other supervisor reports to it every few seconds;
- each supervisor watches its own trainer: its exit status, and the heartbeat files its processes write
  (trainer/heartbeat.py) so a frozen process (SIGSTOP, a hung filesystem) is noticed too;
- the rank-0 supervisor decides the job failed when a trainer dies or freezes, or a node stops answering for
  heartbeat_timeout seconds (or never joins within startup_timeout); it records the node that failed first in
  watch.json and in the trainer's status file, tells every supervisor to stop, and stops its own trainer;
- a supervisor that loses the rank-0 node for heartbeat_timeout seconds stops its trainer by itself.
So a dead trainer or a lost node ends the whole job within heartbeat_timeout plus the stop grace, with or without a
controller, and the reason is in every node's log. A controller that cannot reach a node learns nothing from that.

Node states: none (never started here), running, finished (exit 0), failed (non-zero exit), killed (ended without
an exit status), stopped (stop-training.yml, or by the watch because another node failed first: see "stopped_by").
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

JOB_ENV = "VIDCLUSTER_JOB_DIR"
HEARTBEAT_ENV = "VIDCLUSTER_HEARTBEAT_DIR"
HEARTBEAT_INTERVAL_ENV = "VIDCLUSTER_HEARTBEAT_INTERVAL"
PID_FILE, LOG_FILE, EXIT_FILE, STOP_FILE = "train.pid", "train.log", "train.exit", "train.stopped"
SPEC_FILE, WATCH_FILE, WATCH_PORT_FILE, HEARTBEAT_DIR = "job.json", "watch.json", "watch.port", "heartbeat"
TAIL_LINES = 25
# Failure kinds a node suffers from outside (killed, frozen, lost) come before the errors they cause elsewhere
# ("connection closed by peer"), whatever the clocks say.
EXTERNAL = ("killed", "frozen", "lost")


def node_dir(arg: str) -> Path:
    return Path(os.path.expanduser(arg)).resolve()


def now_text() -> str:
    return time.strftime("%F %T")


def say(message: str) -> None:
    """A line in the node's train.log (the supervisor's stdout)."""
    print(f"jobctl: {message} at {now_text()}", flush=True)


def write_json(path: Path, payload: dict[str, Any]) -> None:
    # Readers (the controller, another command) must never see half a file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# ---------------------------------------------------------------------------------------------------------------------
# The node's processes


def group_members(job: Path, pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` that belong to this job (a reused pid belongs to someone else)."""
    marker = f"{JOB_ENV}={job}".encode()
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # Fields after the command name (which may hold spaces): state ppid pgrp ...
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) != pgid or fields[0] == "Z":
                continue
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                members.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
    return members


def read_pid(job: Path) -> int | None:
    try:
        return int((job / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


def log_tail(job: Path, lines: int = TAIL_LINES) -> list[str]:
    try:
        with (job / LOG_FILE).open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode(errors="replace")
    except OSError:
        return []
    # The progress bar rewrites its line with carriage returns; keep what the last rewrite shows.
    return [line.rsplit("\r", 1)[-1] for line in text.splitlines()[-lines:]]


def state(job: Path) -> dict[str, Any]:
    """The job's state on this node, its watch record and, on the rank-0 node, the trainer's status file."""
    pid = read_pid(job)
    spec = read_json(job / SPEC_FILE) or {}
    info: dict[str, Any] = {"job_dir": str(job), "node": spec.get("node"), "rank": spec.get("rank"), "pid": pid,
                            "rc": None, "watch": read_json(job / WATCH_FILE)}
    stopped = read_json(job / STOP_FILE)
    if pid is None:
        info["state"] = "none"
    elif group_members(job, pid):
        info["state"] = "running"
    else:
        ended = read_json(job / EXIT_FILE) or {}
        info["rc"], info["ended"] = ended.get("rc"), ended.get("ended")
        if stopped is not None:
            info["state"] = "stopped"
        elif info["rc"] is None:
            info["state"] = "killed"
        else:
            info["state"] = "finished" if info["rc"] == 0 else "failed"
    if stopped is not None:
        info["stopped_by"] = stopped
    if info["state"] not in ("none", "running"):
        info["log_tail"] = log_tail(job)
    if spec.get("rank") == 0 and spec.get("status_file"):
        info["run_dir"] = str(Path(spec["status_file"]).parent)
        info["status"] = read_json(Path(spec["status_file"]))
    return info


def signal_group(job: Path, pgid: int, sig: int, spare: int | None = None) -> None:
    for member in group_members(job, pgid):
        if member != spare:
            with contextlib.suppress(ProcessLookupError):
                os.kill(member, sig)


def end_group(job: Path, pgid: int, grace: float, spare: int | None = None) -> list[int]:
    """SIGTERM the group (but ``spare``), SIGKILL what is left after ``grace`` s; the pids still alive after."""
    def left() -> list[int]:
        return [pid for pid in group_members(job, pgid) if pid != spare]

    for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        signal_group(job, pgid, sig, spare)
        deadline = time.monotonic() + wait_s
        while left() and time.monotonic() < deadline:
            time.sleep(0.2)
        if not left():
            break
    return left()


def stale_heartbeats(job: Path, timeout: float) -> list[tuple[int, float]]:
    """(pid, seconds) of live trainer processes whose last heartbeat is older than ``timeout`` seconds."""
    found = []
    folder = job / HEARTBEAT_DIR
    for beat in folder.iterdir() if folder.is_dir() else []:
        try:
            pid, written = int(beat.name), float(beat.read_text())
        except (OSError, ValueError):
            continue  # being written, or not a heartbeat
        age = time.monotonic() - written
        if age > timeout and Path(f"/proc/{pid}").exists():
            found.append((pid, age))
    return found


# ---------------------------------------------------------------------------------------------------------------------
# The watch: who failed first


def describe_exit(rc: int | None) -> tuple[str, str]:
    """(kind, words) for a trainer's exit status."""
    if rc is None:
        return "killed", "its trainer ended without an exit status"
    if rc < 0:
        try:
            name = f" ({signal.Signals(-rc).name})"
        except ValueError:
            name = ""
        return "killed", f"its trainer was killed by signal {-rc}{name}"
    return "exited", f"its trainer exited with status {rc}"


class Watch:
    """The rank-0 supervisor's picture of every node, and the first failure once there is one."""

    def __init__(self, nodes: list[str]) -> None:
        self.lock = threading.Lock()
        self.started = time.time()
        self.nodes: dict[str, dict[str, Any]] = {name: {"state": "starting", "heard": None} for name in nodes}
        self.failures: list[dict[str, Any]] = []

    def heard(self, node: str, report: dict[str, Any]) -> None:
        with self.lock:
            entry = self.nodes[node]
            entry.update({key: report[key] for key in ("state", "rc") if key in report}, heard=time.time())
            entry.pop("lost", None)

    def fail(self, node: str, kind: str, reason: str, at: float | None = None) -> None:
        with self.lock:
            if not any(f["node"] == node for f in self.failures):
                self.failures.append({"node": node, "kind": kind, "reason": reason, "at": at or time.time()})

    def first(self) -> dict[str, Any] | None:
        with self.lock:
            if not self.failures:
                return None
            return min(self.failures, key=lambda f: (f["kind"] not in EXTERNAL, f["at"]))

    def silent(self, timeout: float, startup: float) -> list[tuple[str, str]]:
        """Nodes that stopped answering (or never joined) and have not ended: (node, reason)."""
        now, found = time.time(), []
        with self.lock:
            for node, entry in self.nodes.items():
                if entry["state"] in ("finished", "failed", "exited"):
                    continue
                if entry["heard"] is None and now - self.started > startup:
                    found.append((node, f"it never joined the job's watch within {startup:.0f} s"))
                elif entry["heard"] is not None and now - entry["heard"] > timeout:
                    found.append((node, f"it stopped answering the rank-0 node (nothing heard for {timeout:.0f} s)"))
        return found

    def snapshot(self) -> dict[str, Any]:
        first = self.first()
        with self.lock:
            now = time.time()
            nodes = {name: {**entry, "heard_ago": None if entry["heard"] is None else round(now - entry["heard"], 1)}
                     for name, entry in self.nodes.items()}
            return {"nodes": nodes, "first_failure": first, "failures": list(self.failures), "updated": now}


def send(sock: socket.socket, payload: dict[str, Any]) -> None:
    sock.sendall((json.dumps(payload) + "\n").encode())


def lines(sock: socket.socket):
    """JSON messages from a socket, one per line, until it closes."""
    buffer = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            with contextlib.suppress(ValueError):
                yield json.loads(line)


class Supervisor:
    """Runs the node's trainer and takes part in the watch (as its hub on rank 0, as a reporter elsewhere)."""

    def __init__(self, job: Path, root_watch: str | None) -> None:
        self.job = job
        self.spec = json.loads((job / SPEC_FILE).read_text())
        self.node, self.rank = str(self.spec["node"]), int(self.spec["rank"])
        self.timeout = float(self.spec.get("heartbeat_timeout", 60))
        self.interval = max(0.5, self.timeout / 6)
        self.startup = float(self.spec.get("startup_timeout", 300))
        self.grace = float(self.spec.get("stop_grace", 15))
        self.root_watch = root_watch
        self.watch = Watch([str(n) for n in self.spec["nodes"]])
        self.peers: dict[str, socket.socket] = {}
        self.stop_reason: str | None = None
        self.verdict: str | None = None  # rank 0's word on how the job failed, once it has decided
        self.trainer: subprocess.Popen[bytes] | None = None
        self.rc: int | None = None
        self.ended_at: float | None = None
        self.terminating = False  # SIGTERM from stop-training.yml: end once the trainer has
        self.done = threading.Event()

    # -- the trainer -----------------------------------------------------------------------------------------------

    def start_trainer(self) -> None:
        spec = self.spec
        beats = self.job / HEARTBEAT_DIR
        beats.mkdir(exist_ok=True)
        for old in beats.iterdir():
            old.unlink()
        env = {**os.environ, **{k: str(v) for k, v in spec["env"].items()}, JOB_ENV: str(self.job),
               HEARTBEAT_ENV: str(beats), HEARTBEAT_INTERVAL_ENV: str(self.interval)}
        if int(env.get("OMP_NUM_THREADS", "0") or 0) <= 0:
            # Share the node's cores between its workers instead of every worker taking all of them.
            env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // max(1, int(spec.get("workers", 1)))))
        argv = [os.path.expanduser(spec["argv"][0]), *spec["argv"][1:]]
        say(f"starting {' '.join(argv)} in {spec['cwd']} (node {self.node}, rank {self.rank})")
        try:
            self.trainer = subprocess.Popen(argv, cwd=spec["cwd"], env=env)
        except OSError as exc:
            say(f"cannot start the trainer: {exc}")
            self.rc, self.ended_at = 127, time.time()

    def stop_trainer(self, reason: str, grace: float | None = None) -> None:
        """Stop this node's trainer because of ``reason`` (another node failed, or this one froze)."""
        if self.stop_reason is not None:
            return
        self.stop_reason = reason
        write_json(self.job / STOP_FILE, {"by": "watch", "reason": reason, "at": time.time()})
        say(f"stopping the trainer: {reason}")
        grace = self.grace if grace is None else grace
        threading.Thread(target=end_group, args=(self.job, os.getpgid(0), grace, os.getpid()), daemon=True).start()

    def user_stopped(self) -> bool:
        return (read_json(self.job / STOP_FILE) or {}).get("by") == "user"

    def own_failure(self) -> tuple[str, str] | None:
        """(kind, words) when this node's trainer ended badly on its own (not stopped by us or the user)."""
        if self.rc in (None, 0) or self.stop_reason is not None or self.user_stopped():
            return None
        return describe_exit(self.rc)

    def check_trainer(self) -> None:
        if self.rc is None and self.trainer is not None and self.trainer.poll() is not None:
            self.rc, self.ended_at = self.trainer.returncode, time.time()
            write_json(self.job / EXIT_FILE, {"rc": self.rc, "ended": self.ended_at})
            say(f"trainer exited with status {self.rc}")
        frozen = stale_heartbeats(self.job, self.timeout) if self.rc is None else []
        if frozen and self.stop_reason is None:
            pid, age = frozen[0]
            reason = f"its trainer (pid {pid}) is frozen: no heartbeat for {age:.0f} s"
            self.local_failure("frozen", reason)
            self.stop_trainer(f"{self.node} failed: {reason}", grace=1.0)  # a frozen process cannot exit cleanly

    def local_failure(self, kind: str, reason: str) -> None:
        """This node's own failure: recorded here on rank 0, reported to rank 0 elsewhere."""
        if self.rank == 0:
            self.watch.fail(self.node, kind, reason)
        else:
            self.report({"failure": {"kind": kind, "reason": reason, "at": time.time()}})

    # -- rank 0: the hub -------------------------------------------------------------------------------------------

    def serve(self, server: socket.socket) -> None:
        while not self.done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=self.serve_peer, args=(conn,), daemon=True).start()

    def serve_peer(self, conn: socket.socket) -> None:
        node = None
        with conn:
            try:
                for message in lines(conn):
                    node = str(message.get("node"))
                    if node not in self.watch.nodes:
                        return
                    self.peers[node] = conn
                    self.watch.heard(node, message)
                    failure = message.get("failure")
                    if failure:
                        self.watch.fail(node, failure["kind"], failure["reason"], failure.get("at"))
                    # Every report is answered, so the other side knows rank 0 is alive (and, once decided, how the
                    # job failed).
                    send(conn, {"stop": self.verdict} if self.verdict else {"ok": True})
            except OSError:
                pass
        if node is not None and self.peers.get(node) is conn:
            del self.peers[node]

    def broadcast_stop(self, reason: str) -> None:
        for conn in list(self.peers.values()):
            with contextlib.suppress(OSError):
                send(conn, {"stop": reason})

    def hub_round(self) -> None:
        """One look at the job from rank 0: record silent nodes, act on the first failure."""
        failed = self.own_failure()
        if failed is not None:
            self.watch.fail(self.node, *failed, self.ended_at)
        for node, reason in self.watch.silent(self.timeout, self.startup):
            if node != self.node:
                self.watch.fail(node, "lost", reason)
        first = self.watch.first()
        if first is not None and self.verdict is None:
            time.sleep(min(3.0, self.interval))  # let the causes arrive before naming the first one
            first = self.watch.first() or first
            self.verdict = f"{first['node']} failed first: {first['reason']}"
            self.broadcast_stop(self.verdict)
            if self.rc is None:
                self.stop_trainer(self.verdict)
        snapshot = self.watch.snapshot()
        snapshot["nodes"][self.node].update(state="running" if self.rc is None else "exited", rc=self.rc,
                                            heard_ago=0.0)
        write_json(self.job / WATCH_FILE, snapshot)

    def hub_finished(self) -> bool:
        """Rank 0 ends once its trainer has and every other node reported its end (or went silent)."""
        if self.rc is None:
            return False
        if self.terminating:
            return True
        others = [e for n, e in self.watch.snapshot()["nodes"].items() if n != self.node]
        reported = all(e["state"] in ("finished", "failed", "exited") for e in others)
        return reported or time.time() - (self.ended_at or 0) > self.timeout

    def record_in_status(self) -> None:
        """Put the first failure into the trainer's status file, which the trainer could not do once stopped."""
        first = self.watch.first()
        status_file = self.spec.get("status_file")
        if first is None or not status_file:
            return
        status = read_json(Path(status_file)) or {}
        status.update(state="failed", first_failure=first,
                      message=f"{first['node']} failed first: {first['reason']}")
        with contextlib.suppress(OSError):
            write_json(Path(status_file), status)

    # -- other ranks: reporting to rank 0 ----------------------------------------------------------------------

    def report(self, extra: dict[str, Any] | None = None) -> None:
        message = {"node": self.node, "state": "running" if self.rc is None else "exited", "rc": self.rc,
                   **(extra or {})}
        failed = self.own_failure()
        if failed is not None:
            message["failure"] = {"kind": failed[0], "reason": failed[1], "at": self.ended_at}
        conn = self.peers.get("root")
        if conn is not None:
            with contextlib.suppress(OSError):
                send(conn, message)

    def link(self) -> None:
        """Keep a connection to rank 0's watch; stop the trainer when rank 0 is lost for too long."""
        host, _, port = (self.root_watch or "").rpartition(":")
        last_contact = time.time()
        while not self.done.is_set():
            try:
                conn = socket.create_connection((host.strip("[]"), int(port)), timeout=self.interval * 2)
            except (OSError, ValueError):
                conn = None
            if conn is not None:
                self.peers["root"] = conn
                self.report()
                try:
                    conn.settimeout(self.timeout)
                    for message in lines(conn):
                        last_contact = time.time()
                        if message.get("stop"):
                            self.verdict = str(message["stop"])
                            if self.rc is None:
                                self.stop_trainer(self.verdict)
                except OSError:
                    pass
                self.peers.pop("root", None)
                with contextlib.suppress(OSError):
                    conn.close()
            if self.rc is not None and self.verdict is not None:
                return  # our trainer has ended and rank 0 has said how the job ended: it may go away now
            if time.time() - last_contact > self.timeout and self.stop_reason is None:
                self.stop_trainer(f"lost contact with the rank-0 node ({self.root_watch}) for {self.timeout:.0f} s")
            self.done.wait(self.interval)

    def await_verdict(self) -> None:
        """Our trainer has ended. If it failed, rank 0 may already know that another node failed first (our trainer
        only lost its peers): wait a little for that word, so this node's log and state say what really happened."""
        deadline = time.time() + (0.0 if self.rc == 0 else self.interval * 2 + 5)
        self.report()
        while self.verdict is None and time.time() < deadline:
            time.sleep(0.5)
            self.report()

    def record_verdict(self) -> None:
        """Log how the job ended; a trainer that ended because another node failed first was stopped by that."""
        reason = self.verdict
        if not reason:
            return
        say(f"the job failed: {reason}")
        if self.rc not in (None, 0) and not reason.startswith(f"{self.node} failed") and self.stop_reason is None:
            write_json(self.job / STOP_FILE, {"by": "watch", "reason": reason, "at": time.time()})

    def keepalive(self) -> None:
        while not self.done.is_set():
            self.report()
            self.done.wait(self.interval)

    # -- both ------------------------------------------------------------------------------------------------------

    def on_sigterm(self, *_: Any) -> None:
        # stop-training.yml signals the whole group: the trainer ends, and so do we once it has.
        self.terminating = True

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self.on_sigterm)
        server = None
        if self.rank == 0:
            server = socket.create_server((str(self.spec["root_ip"]), 0))
            port = server.getsockname()[1]
            (self.job / WATCH_PORT_FILE).write_text(f"{self.spec['root_ip']}:{port}\n")
            threading.Thread(target=self.serve, args=(server,), daemon=True).start()
        else:
            threading.Thread(target=self.link, daemon=True).start()
            threading.Thread(target=self.keepalive, daemon=True).start()
        self.start_trainer()
        while True:
            self.check_trainer()
            if self.rank == 0:
                self.hub_round()
                if self.hub_finished():
                    break
            elif self.rc is not None:
                self.await_verdict()
                break
            time.sleep(min(1.0, self.interval / 2))
        if self.rank == 0:
            self.record_in_status()
            self.hub_round()
        self.record_verdict()
        self.done.set()
        if server is not None:
            server.close()
        return 0


# ---------------------------------------------------------------------------------------------------------------------
# Commands


def start(job: Path, root_watch: str | None) -> dict[str, Any]:
    current = state(job)
    if current["state"] == "running":
        raise SystemExit(f"job {job.name} is already running on this node (pid {current['pid']}); stop it first")
    for name in (EXIT_FILE, STOP_FILE, WATCH_FILE, WATCH_PORT_FILE):
        (job / name).unlink(missing_ok=True)
    env = {**os.environ, JOB_ENV: str(job)}
    argv = [sys.executable, str(Path(__file__).resolve()), "supervise", str(job), *([root_watch] if root_watch else [])]
    with (job / LOG_FILE).open("ab") as log:
        # A new session: the job outlives the SSH connection and its process group is its own.
        proc = subprocess.Popen(argv, cwd=job, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True, close_fds=True)
    (job / PID_FILE).write_text(f"{proc.pid}\n")
    result: dict[str, Any] = {"pid": proc.pid, "state": "running", "log": str(job / LOG_FILE)}
    if (read_json(job / SPEC_FILE) or {}).get("rank") == 0:  # the others need rank 0's watch address
        deadline = time.monotonic() + 30
        while not (job / WATCH_PORT_FILE).exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        result["watch"] = (job / WATCH_PORT_FILE).read_text().strip() if (job / WATCH_PORT_FILE).exists() else ""
    return result


def wait(job: Path, seconds: float) -> dict[str, Any]:
    """Until the node's job ends, the watch records a failure, or ``seconds`` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        current = state(job)
        if current["state"] != "running" or (current["watch"] or {}).get("first_failure"):
            return current
        time.sleep(1.0)
    return state(job)


def stop(job: Path, grace: float, by: str = "user", reason: str = "stopped with stop-training.yml") -> dict[str, Any]:
    pid = read_pid(job)
    if pid is None or not group_members(job, pid):
        return {"changed": False, **state(job)}
    if not (job / STOP_FILE).exists():  # the watch may have said why already
        write_json(job / STOP_FILE, {"by": by, "reason": reason, "at": time.time()})
    left = end_group(job, pid, grace)
    return {"changed": True, "left": left, **state(job)}


def settle(job: Path, grace: float, reason: str) -> dict[str, Any]:
    """After a failure elsewhere: give the node's own watch ``grace`` s (plus a little) to end the job, then stop
    what is left (the launcher saw a real failure)."""
    deadline = time.monotonic() + grace + 10
    pid = read_pid(job)
    while pid is not None and group_members(job, pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    return stop(job, grace, "launcher", reason)


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    command, job, rest = argv[0], node_dir(argv[1]), argv[2:]
    if command == "supervise":
        return Supervisor(job, rest[0] if rest else None).run()
    if command == "start":
        result = start(job, rest[0] if rest else None)
    elif command == "wait":
        result = wait(job, float(rest[0]))
    elif command == "status":
        result = state(job)
    elif command == "stop":
        result = stop(job, float(rest[0]) if rest else 15.0)
    elif command == "settle":
        result = settle(job, float(rest[0]), rest[1] if len(rest) > 1 else "stopped by the launcher")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
