"""A Kinetics-style dataset from its raw download: every clip of the annotation CSVs transcoded once, with the work
spread over the nodes (playbooks/prepare-data.yml, roles/prepare_data).

What it makes, in the destination folder DEST:

    <split>/<label>/<youtube_id>_<start:06d>_<end:06d>.mp4   each clip: H.264, the asked short side and frame rate,
                                                            a keyframe every KEYINT frames (no scene-cut ones), no
                                                            audio, trimmed to the clip's time range
    <split>.txt                                             GluonCV lists: "<split>/<label>/<clip>.mp4 frames label"
    classInd.txt                                            the CSVs' labels, one a line, in label order
    report.json                                             every clip that could not be made, and why; totals per
                                                            split and class
    .vidcluster-manifest.json                               trainer/data/manifest.py's manifest (stage-data.yml
                                                            stages it without hashing anything again)
    .vidcluster-prepare/state.json                          what each clip was made from, and with which options

A clip's source is found in SRC by name, anywhere in its tree: the downloaders' trimmed clip
``<youtube_id>_<start:06d>_<end:06d>.<ext>`` (ActivityNet's and MMAction2's download.py name them so), else the whole
video ``<youtube_id>.<ext>``, trimmed here. Labels are in the order the references publish them (GluonCV's,
PySlowFast's and MMAction2's Kinetics label maps sort the names; the Kinetics CSVs list their rows in that order too).

A clip is made again only when its source (size, mtime) or the options changed, or its output went missing; one that
could not be made is tried again only when its source changed.

Standard library only (ffmpeg, ffprobe and rsync on the nodes), and runnable as a script: the role runs the node
commands with every node's own python3, trainer/data/manifest.py and trainer/data/transcode.py (making one clip)
passed along (nothing is installed there):

    prepare.py probe SRC WORK [--index]    what this node sees of SRC (a digest of its listing), its tools and CPUs;
                                           --index: also SRC's listing, WORK/source-index.json (the source holder)
    prepare.py deliver WORK                stop a run an interrupted play left, send what it made
    prepare.py state DEST WORK             fold the runs' results into DEST's state; the handle WORK/dest -> DEST
    prepare.py run WORK [--detach]         this node's share (WORK/jobs.json): fetch sources it cannot read in place,
                                           transcode, send the outputs where DEST is; progress in WORK/progress.json
    prepare.py seal DEST SOURCE WORK       DEST's manifest, seeded with the hashes taken while transcoding

and on the controller (``python -m trainer.data.prepare_plan``, from the repository, which runs the node commands
too, as the controller's own node; trainer/data/prepare_plan.py):

    prepare.py plan CSV... --index F --state F --layout F --options JSON --out DIR
                                           which node makes which clip (DIR/<node>.json, DIR/<node>.list), and the
                                           catalog of every clip (DIR/catalog.json); prints a summary
    prepare.py lists CATALOG STATE OUT     the lists, classInd.txt and report.json into OUT
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from trainer.data import manifest
from trainer.data.transcode import Options, PrepareError, make_clip

STATE_DIR = ".vidcluster-prepare"  # the tools' own prefix: never listed, staged or hashed as data
STATE_FORMAT = "vidcluster-prepare/1"
LIST_SUFFIX, CLASS_INDEX, REPORT = ".txt", "classInd.txt", "report.json"  # DEST's lists and own files, by lists()
OWN_FILES = (CLASS_INDEX, REPORT)
BEAT_SECONDS = 1.0
STOP_WAIT = 30.0
STALL_MARGIN = 10.0  # seconds past a clip's limit before a run in which no clip finishes is ended
RSYNC_SSH = "ssh -o BatchMode=yes"  # the cluster's SSH mesh (setup-cluster.yml): node names, verified host keys
CONTROLLER_COMMANDS = ("plan", "lists")  # trainer.data.prepare_plan's (parsed here, with the rest), never run on a node


# ---------------------------------------------------------------------------------------------------------------------
# The source folder


def expand(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def source_listing(src: str) -> list[tuple[str, int, int]]:
    """(relative path, size, mtime_ns) of every file under src, sorted (manifest.walk's rules)."""
    return [(rel, st.st_size, st.st_mtime_ns) for rel, st in manifest.walk(src)]


def listing_digest(listing: list[tuple[str, int, int]]) -> str:
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


def find_sources(listing: list[tuple[str, int, int]]) -> dict[str, tuple[str, int, int]]:
    """File name without its extension -> (path, size, mtime_ns): the first in sorted order where names repeat."""
    found: dict[str, tuple[str, int, int]] = {}
    for entry in listing:
        stem = os.path.splitext(os.path.basename(entry[0]))[0]
        found.setdefault(stem, entry)
    return found


def tool_problem(*argv: str) -> str:
    """'' when the tool runs here, else why not."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        return f"{argv[0]}: {exc.strerror}"
    return "" if done.returncode == 0 else f"{argv[0]} exits {done.returncode}"


def probe(src: str, work: str, index: bool) -> dict[str, Any]:
    """What this node sees at SRC (the digest of its listing, or why it cannot read it) and whether it can work.
    --index (the node holding SRC): also the listing, in WORK/source-index.json, and the handle WORK/src -> SRC."""
    work = expand(work)
    os.makedirs(work, mode=0o700, exist_ok=True)
    out: dict[str, Any] = {"src": expand(src), "work": work, "digest": None, "problem": "",
                           "cpus": os.cpu_count() or 1,
                           "tools": {tool: tool_problem(tool, "-version") for tool in ("ffmpeg", "ffprobe")}}
    out["tools"]["rsync"] = tool_problem("rsync", "--version")
    try:
        listing = source_listing(out["src"])
    except manifest.ManifestError as exc:
        out["problem"] = str(exc)
        return out
    out["digest"] = listing_digest(listing)
    out["files"] = len(listing)
    if index:
        manifest.write_atomically(os.path.join(work, "source-index.json"), json.dumps(listing))
        manifest.point(os.path.join(work, "src"), out["src"])
    return out


# ---------------------------------------------------------------------------------------------------------------------
# A node's run: its share, fetched, made and delivered


def stalled(state: dict[str, Any], idle: float, limit: float) -> str | None:
    """Why a run must end, or None: transcoding, no clip finished for ``idle`` seconds, more than a clip may take
    (``limit``, options.timeout) and STALL_MARGIN; each clip has that deadline, so something hangs outside it."""
    if state["phase"] != "transcoding" or idle <= limit + STALL_MARGIN:
        return None
    making = ", ".join(sorted(state["making"])) or "nothing"
    return f"no clip finished for {idle:.0f} s (a clip may take {limit:g} s); still making: {making}"


class Progress:
    """The run's numbers, in WORK/progress.json (replaced atomically every BEAT_SECONDS and at the end), and the
    clips being made ("making", their sources). A heartbeat that goes on while no clip finishes is no sign of life:
    the beat ends the run (``stalled``)."""

    def __init__(self, path: str, total: int, limit: float) -> None:
        self.path, self.limit = path, limit
        self.state: dict[str, Any] = {"pid": os.getpid(), "beat": 0, "phase": "starting", "total": total, "made": 0,
                                      "bad": 0, "making": [], "finished": False}
        self.lock = threading.Lock()
        self.last_done = time.monotonic()  # the last clip that finished, or the phase's start
        self.write()

    def update(self, **fields: Any) -> None:
        with self.lock:
            if any(key in fields for key in ("made", "bad", "phase")):
                self.last_done = time.monotonic()
            for key, value in fields.items():
                self.state[key] = self.state[key] + value if key in ("made", "bad") else value

    def making(self, src: str, started: bool) -> None:
        with self.lock:
            (self.state["making"].append if started else self.state["making"].remove)(src)

    def beat(self) -> None:
        while not self.state["finished"]:
            time.sleep(BEAT_SECONDS)
            with self.lock:
                error = stalled(self.state, time.monotonic() - self.last_done, self.limit)
            if error is not None:
                self.update(finished=True, rc=1, error=error)
                self.write()
                os.killpg(0, signal.SIGKILL)  # the run and every ffmpeg it started (stop_on_term's way)
            self.write()

    def write(self) -> None:
        with self.lock:
            self.state["beat"] += 1
            text = json.dumps(self.state)
        manifest.write_atomically(self.path, text)


def take_lock(work: str) -> Any:
    """Hold WORK/lock, stopping the run that holds it (one an interrupted play left): the lock holds its pid."""
    lock = open(os.path.join(work, "lock"), "a+")  # noqa: SIM115 (held for the life of the process)
    deadline = time.monotonic() + STOP_WAIT
    while not _locked(lock):
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(os.pread(lock.fileno(), 32, 0)), signal.SIGTERM)  # stop_on_term: it ends at once
        if time.monotonic() > deadline:
            raise PrepareError(f"{work}/lock: the run holding it did not stop")
        time.sleep(0.2)
    os.ftruncate(lock.fileno(), 0)
    os.pwrite(lock.fileno(), str(os.getpid()).encode(), 0)
    return lock


def _locked(lock: Any) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def stop_on_term() -> None:
    """SIGTERM (a newer run taking the lock) ends this run and every ffmpeg and rsync it started, at once."""
    signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))


def read_spec(work: str) -> dict[str, Any]:
    with open(os.path.join(work, "jobs.json"), encoding="utf-8") as f:
        return json.load(f)


def rsync(argv: list[str]) -> None:
    done = subprocess.run(["rsync", *argv], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise PrepareError(f"rsync exits {done.returncode}: {(done.stderr.strip().splitlines() or [''])[-1]}")


def fetch_share(spec: dict[str, Any], work: str) -> None:
    """The node's sources from the node that holds them (over the cluster's SSH mesh), into WORK/in."""
    fetch = spec["fetch"]
    rsync(["-rtL", "--from0", f"--files-from={os.path.join(work, 'jobs.list')}", "-e", RSYNC_SSH,
           f"{fetch['host']}:{fetch['handle']}/", f"{os.path.join(work, 'in')}/"])


def send_outputs(spec: dict[str, Any], work: str) -> bool:
    """What WORK/out holds (clips and their results) to the node that writes DEST; whether anything was there."""
    out = os.path.join(work, "out")
    if spec["send"] is None or not any(files for _, _, files in os.walk(out)):
        return False
    rsync(["-rt", "--remove-source-files", "-e", RSYNC_SSH, f"{out}/",
           f"{spec['send']['host']}:{spec['send']['handle']}/"])
    for folder, _, _ in sorted(os.walk(out), key=lambda entry: -len(entry[0])):
        with contextlib.suppress(OSError):
            os.rmdir(folder)  # only empty folders go
    return True


def run(work: str, progress: Progress) -> None:
    spec = read_spec(work)
    options = Options.from_json(spec["options"])
    jobs = spec["jobs"]
    src_dir = os.path.join(work, "in") if spec["src"] is None else expand(spec["src"])
    out_dir = os.path.join(work, "out") if spec["dest"] is None else expand(spec["dest"])
    results = os.path.join(out_dir, STATE_DIR, "results", f"{spec['node']}.{spec['token']}.jsonl")
    os.makedirs(os.path.dirname(results), exist_ok=True)
    if spec["fetch"]:
        progress.update(phase="fetching")
        Path(work, "jobs.list").write_bytes(b"".join(os.fsencode(job["src"]) + b"\0" for job in jobs))
        fetch_share(spec, work)
    progress.update(phase="transcoding")
    written = threading.Lock()
    with open(results, "a", encoding="utf-8") as record:

        def one(job: dict[str, Any]) -> None:
            progress.making(job["src"], started=True)
            result = make_clip(job, src_dir, out_dir, options)
            progress.making(job["src"], started=False)
            with written:
                record.write(json.dumps(result) + "\n")
                record.flush()
            progress.update(made=int(result["ok"]), bad=int(not result["ok"]))

        with ThreadPoolExecutor(options.jobs or os.cpu_count() or 1) as pool:
            list(pool.map(one, jobs))
    if spec["send"]:
        progress.update(phase="sending")
        send_outputs(spec, work)
    if spec["src"] is None:  # the sources it was sent: made, so no longer needed here
        shutil.rmtree(os.path.join(work, "in"), ignore_errors=True)


def run_detached(work: str, detach: bool) -> int:
    """``run`` in a daemon (detach: the caller returns once it started) that holds WORK/lock; WORK/progress.json
    says how it goes and how it ended ("finished", "rc", "error")."""
    work = expand(work)
    started_r, started_w = os.pipe()
    if detach:
        first = os.fork()
        if first:
            os.close(started_w)
            os.waitpid(first, 0)  # the daemon's parent, gone once the daemon forked
            if os.read(started_r, 1) == b"1":
                return 0
            with contextlib.suppress(OSError), open(os.path.join(work, "run.log"), encoding="utf-8") as log:
                sys.stderr.write(log.read()[-2000:])
            return 1
        os.close(started_r)
        os.setsid()
        if os.fork():
            os._exit(0)
        null = os.open(os.devnull, os.O_RDWR)
        log = os.open(os.path.join(work, "run.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for fd, target in ((0, null), (1, null), (2, log)):
            os.dup2(target, fd)
    else:
        with contextlib.suppress(PermissionError):  # (already a group of its own)
            os.setpgid(0, 0)  # killpg on SIGTERM must not reach the caller
    status = 1
    try:
        _lock = take_lock(work)
        stop_on_term()
        spec = read_spec(work)
        progress = Progress(os.path.join(work, "progress.json"), len(spec["jobs"]),
                            Options.from_json(spec["options"]).timeout)
        os.write(started_w, b"1")
        threading.Thread(target=progress.beat, daemon=True).start()
        error = ""
        try:
            run(work, progress)
            status = 0
        except (PrepareError, OSError) as exc:
            error = str(exc)
        progress.update(finished=True, rc=status, error=error)
        progress.write()
    except BaseException:
        traceback.print_exc()  # into WORK/run.log, which the caller shows
        raise
    finally:
        if detach:
            sys.stderr.flush()
            os._exit(status)
    return status


def deliver(work: str) -> dict[str, Any]:
    """Stop a run an interrupted play left (it holds the lock), send what it made where DEST is, and drop the
    sources it was sent (the next plan sends what it needs)."""
    work = expand(work)
    if not os.path.exists(os.path.join(work, "jobs.json")):
        return {"sent": False}
    lock = take_lock(work)
    try:
        shutil.rmtree(os.path.join(work, "in"), ignore_errors=True)
        return {"sent": send_outputs(read_spec(work), work)}
    finally:
        lock.close()


# ---------------------------------------------------------------------------------------------------------------------
# DEST's state, lists and manifest (on the node that writes DEST, and on the controller)


def read_state(path: str) -> dict[str, dict[str, Any]]:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise PrepareError(f"{path}: not a readable state ({exc})") from None
    if data.get("format") != STATE_FORMAT:
        raise PrepareError(f"{path}: not a {STATE_FORMAT} state")
    return data["outputs"]


def state_text(outputs: dict[str, dict[str, Any]]) -> str:
    """Canonical text, one clip a line."""
    rows = ",\n".join(f"{json.dumps(out)}: {json.dumps(outputs[out], sort_keys=True)}" for out in sorted(outputs))
    return f'{{"format": "{STATE_FORMAT}", "outputs": {{\n{rows}\n}}}}\n'


def fold_state(dest: str, work: str) -> dict[str, Any]:
    """Fold every run's results into DEST's state (a result replaces the clip's entry; a clip whose file went missing
    or changed size is forgotten, so it is made again), and point the handle WORK/dest at DEST (nodes that do not see
    DEST send their clips there)."""
    dest, work = expand(dest), expand(work)
    os.makedirs(os.path.join(dest, STATE_DIR), exist_ok=True)
    os.makedirs(work, mode=0o700, exist_ok=True)
    manifest.point(os.path.join(work, "dest"), dest)
    state_path = os.path.join(dest, STATE_DIR, "state.json")
    outputs = read_state(state_path)
    before = state_text(outputs) if os.path.exists(state_path) else ""
    results = sorted(Path(dest, STATE_DIR, "results").glob("*.jsonl"))
    for path in results:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                result = json.loads(line)
                outputs[result.pop("out")] = result
    for out, entry in list(outputs.items()):
        try:
            st = os.stat(os.path.join(dest, out))
            found: tuple[int, int] | None = (st.st_size, st.st_mtime_ns)
        except FileNotFoundError:
            found = None
        if not still_made(entry, found):
            del outputs[out]
    text = state_text(outputs)
    if text != before:
        manifest.write_atomically(state_path, text)
    for path in results:
        path.unlink()
    return {"changed": text != before, "clips": len(outputs), "path": state_path, "dest": dest}


def still_made(entry: dict[str, Any], found: tuple[int, int] | None) -> bool:
    """Whether a clip's state entry stands, given its file in DEST ((size, mtime_ns), None when missing): a made clip
    whose file went missing or changed size is forgotten, so it is made again; one whose mtime alone changed (sent
    by rsync -t: the same second, the same content) stands, its entry given the new mtime. A clip that could not be
    made has no file: its entry stands."""
    if not entry["ok"]:
        return True
    if found is None or found[0] != entry["file"][0]:
        return False
    entry["file"][1] = found[1]
    return True


def seal(dest: str, source: str, work: str) -> dict[str, Any]:
    """DEST's manifest (trainer/data/manifest.py): the clips' hashes come from the state (taken while they were
    made), the folder's earlier manifest gives the rest it knows; only files neither knows are hashed. Built in
    WORK, installed in DEST only when it changed."""
    dest, work = expand(dest), expand(work)
    known = {}
    with contextlib.suppress(manifest.ManifestError):
        known = {e.path: e for e in manifest.read_manifest(os.path.join(dest, manifest.MANIFEST))[0].entries}
    for out, entry in read_state(os.path.join(dest, STATE_DIR, "state.json")).items():
        if entry["ok"]:
            size, mtime_ns, sha256 = entry["file"]
            known[out] = manifest.Entry(out, size, mtime_ns, sha256)
    seed = os.path.join(work, "manifest.json")
    manifest.write_atomically(seed, manifest.Manifest(source, sorted(known.values(), key=lambda e: e.path)).dumps())
    built = manifest.build(dest, seed, source)
    target = os.path.join(dest, manifest.MANIFEST)
    try:
        with open(target, encoding="utf-8") as f:
            changed = f.read() != Path(seed).read_text(encoding="utf-8")
    except OSError:
        changed = True
    manifest.install(dest, seed)
    return {**built, "changed": changed}


# ---------------------------------------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="prepare.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("probe")
    p.add_argument("src")
    p.add_argument("work")
    p.add_argument("--index", action="store_true")
    commands.add_parser("deliver").add_argument("work")
    p = commands.add_parser("state")
    p.add_argument("dest")
    p.add_argument("work")
    p = commands.add_parser("run")
    p.add_argument("work")
    p.add_argument("--detach", action="store_true")
    p = commands.add_parser("seal")
    p.add_argument("dest")
    p.add_argument("source")
    p.add_argument("work")
    p = commands.add_parser("plan")
    p.add_argument("csv", nargs="+")
    for flag in ("--index", "--state", "--layout", "--options", "--out"):
        p.add_argument(flag, required=True)
    p = commands.add_parser("lists")
    p.add_argument("catalog")
    p.add_argument("state")
    p.add_argument("out")
    return parser


def answer(args: argparse.Namespace) -> dict[str, Any]:
    """What a node's command (other than run) prints, as JSON."""
    if args.command == "probe":
        return probe(args.src, args.work, args.index)
    if args.command == "deliver":
        return deliver(args.work)
    if args.command == "state":
        return fold_state(args.dest, args.work)
    return seal(args.dest, args.source, args.work)


def answered(command: Callable[[], dict[str, Any] | int]) -> int:
    """A command's answer printed as JSON (a status: returned as it is); bad input ends it with one "error: ..." line
    on stderr and status 2."""
    try:
        result = command()
    except (PrepareError, manifest.ManifestError, OSError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    if isinstance(result, int):
        return result
    print(json.dumps(result))
    return 0


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.command in CONTROLLER_COMMANDS:  # the nodes carry this file without the controller's module
        print(f"error: {args.command} is the controller's: python -m trainer.data.prepare_plan {args.command} ...",
              file=sys.stderr)
        return 2
    if args.command == "run":
        return answered(lambda: run_detached(args.work, args.detach))
    return answered(lambda: answer(args))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
