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
commands with every node's own python3 and trainer/data/manifest.py passed along (nothing is installed there):

    prepare.py probe SRC WORK [--index]    what this node sees of SRC (a digest of its listing), its tools and CPUs;
                                           --index: also SRC's listing, WORK/source-index.json (the source holder)
    prepare.py deliver WORK                stop a run an interrupted play left, send what it made
    prepare.py state DEST WORK             fold the runs' results into DEST's state; the handle WORK/dest -> DEST
    prepare.py run WORK [--detach]         this node's share (WORK/jobs.json): fetch sources it cannot read in place,
                                           transcode, send the outputs where DEST is; progress in WORK/progress.json
    prepare.py seal DEST SOURCE WORK       DEST's manifest, seeded with the hashes taken while transcoding

and on the controller (``python -m trainer.data.prepare``, from the repository):

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.data import manifest

if TYPE_CHECKING:
    from trainer.data.annotations import KineticsClip

STATE_DIR = ".vidcluster-prepare"  # the tools' own prefix: never listed, staged or hashed as data
STATE_FORMAT = "vidcluster-prepare/1"
TMP_PREFIX = ".vidcluster-tmp-"
LIST_SUFFIX, CLASS_INDEX, REPORT = ".txt", "classInd.txt", "report.json"  # DEST's lists and own files, by lists()
OWN_FILES = (CLASS_INDEX, REPORT)
BEAT_SECONDS = 1.0
STOP_WAIT = 30.0
STALL_MARGIN = 10.0  # seconds past a clip's limit before a run in which no clip finishes is ended
RSYNC_SSH = "ssh -o BatchMode=yes"  # the cluster's SSH mesh (setup-cluster.yml): node names, verified host keys
# The demuxers of a video dataset (Kinetics' downloads: mp4, webm, mkv; older sets: avi, flv, MPEG): none that reads
# other files or the network for a source (a playlist, hls or dash, or concat): a source named like a clip is read
# as the video it is, or refused. With the file protocol only, nothing else is opened.
DEMUXERS = "mov,mp4,m4a,3gp,3g2,mj2,matroska,webm,avi,flv,mpeg,mpegts"
INPUT_ONLY = ("-format_whitelist", DEMUXERS, "-protocol_whitelist", "file")
X264_PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast", "medium", "slow", "slower", "veryslow")


class PrepareError(Exception):
    """Bad input or a folder that cannot be used; the message names it."""


@dataclass(frozen=True)
class Options:
    """How every clip is made. The defaults are the references' prepared Kinetics: a 256 px short side (MMAction2's
    resize_videos.py, PySlowFast's DATASET.md), 30 frames/s (PySlowFast's DATA.TARGET_FPS), a keyframe every 16
    frames (MMAction2's --dense), x264's own quality and speed (crf 23, medium)."""

    short_side: int = 256
    fps: int = 30
    keyint: int = 16
    crf: int = 23
    preset: str = "medium"
    shortfall: float = 1.0  # seconds a source may fall short of its clip's time range
    timeout: float = 600.0  # seconds one clip may take to make
    jobs: int = 0  # ffmpeg processes at once per node; 0: the node's CPU count

    @classmethod
    def from_json(cls, values: dict[str, Any]) -> Options:
        """Options from JSON, each value as its field's type (Ansible may hand numbers over as text)."""
        fields = cls.__dataclass_fields__
        unknown = sorted(set(values) - set(fields))
        if unknown:
            raise PrepareError(f"unknown option(s): {', '.join(unknown)}")
        try:
            return cls(**{key: type(getattr(cls(), key))(value) for key, value in values.items()})
        except ValueError as exc:
            raise PrepareError(f"an option is not of its type: {exc}") from None

    def digest(self) -> str:
        """What the outputs depend on (not how fast they are made)."""
        made = {k: v for k, v in asdict(self).items() if k not in ("timeout", "jobs")}
        return hashlib.sha256(json.dumps(made, sort_keys=True).encode()).hexdigest()[:16]

    def check(self) -> None:
        """PrepareError naming the first option ffmpeg could not honour."""
        if self.preset not in X264_PRESETS:
            raise PrepareError(f"preset must be one of x264's ({', '.join(X264_PRESETS)}), got {self.preset!r}")
        if self.short_side < 2 or self.short_side % 2:
            raise PrepareError(f"short_side must be an even number of pixels (H.264 in 4:2:0), got {self.short_side}")
        for name in ("fps", "keyint", "timeout"):
            if getattr(self, name) <= 0:
                raise PrepareError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.crf <= 51:
            raise PrepareError(f"crf must be in 0..51 (x264), got {self.crf}")


# ---------------------------------------------------------------------------------------------------------------------
# The annotation CSVs


def clip_path(clip: KineticsClip) -> str:
    """Where a clip is made in DEST."""
    return f"{clip.split}/{clip.label}/{clip.name}.mp4"


def read_clips(paths: list[str]) -> tuple[list[KineticsClip], list[tuple[KineticsClip, str]]]:
    """Every clip of the CSVs (on the controller: trainer.data.annotations reads them), in their order, and the ones
    listed again (with the first listing's place)."""
    from trainer.data.annotations import AnnotationError, read_kinetics_csv

    clips: dict[str, KineticsClip] = {}
    again: list[tuple[KineticsClip, str]] = []
    try:
        for path in paths:
            for clip in read_kinetics_csv(path):
                split_problem(clip)
                first = clips.setdefault(clip_path(clip), clip)
                if first is not clip:
                    again.append((clip, f"listed twice (also {first.where})"))
    except AnnotationError as exc:
        raise PrepareError(str(exc)) from None
    if not clips:
        raise PrepareError(f"{', '.join(paths)}: no clips listed")
    return list(clips.values()), again


def split_problem(clip: KineticsClip) -> None:
    """PrepareError naming the CSV's line when the clip's split would name one of DEST's own files: its list
    <split>.txt is another of them (split "classInd"), or its folder <split>/ is one (split "report.json", or
    "train.txt", the list of split "train")."""
    split = clip.split
    if f"{split}{LIST_SUFFIX}" in OWN_FILES or split in OWN_FILES or split.endswith(LIST_SUFFIX):
        raise PrepareError(f"{clip.where}: split {split!r} would overwrite the dataset's own files "
                           f"({', '.join(OWN_FILES)}, the lists <split>{LIST_SUFFIX})")


def class_names(clips: list[KineticsClip]) -> list[str]:
    """The labels in the references' published order: sorted by name."""
    return sorted({clip.label for clip in clips})


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
# The plan (on the controller)


def plan(csvs: list[str], index_file: str, state_file: str, layout: dict[str, Any], options: Options,
         out_dir: str) -> dict[str, Any]:
    """Which node makes which clip. ``layout`` (the role's): "nodes" in the play's order, their "cpus", which read SRC
    themselves ("in_place") and which see DEST ("writers"); "src" and "dest" as the nodes name them, "holder" (the
    node holding SRC; "" for the controller), "collector" (the node that writes DEST), their "src_handle" and
    "dest_handle", the play's "token". Writes DIR/<node>.json (the node's jobs.json) and DIR/<node>.list (its sources,
    NUL-separated) for every node with work, and DIR/catalog.json; returns the summary."""
    options.check()
    nodes = [{"name": name, "cpus": int(layout["cpus"][name]), "in_place": name in layout["in_place"],
              "writes_dest": name in layout["writers"]} for name in layout["nodes"]]
    clips, again = read_clips(csvs)
    with open(index_file, encoding="utf-8") as f:
        sources = find_sources([tuple(entry) for entry in json.load(f)])
    made = read_state(state_file)
    digest = options.digest()
    rows: list[list[Any]] = []
    todo: list[dict[str, Any]] = []
    done = missing = 0
    for clip in clips:
        trimmed = sources.get(clip.name)
        whole = None if trimmed is not None else sources.get(clip.youtube_id)
        found = trimmed or whole
        planned = None
        if found is None:
            planned = "missing from the source"
            missing += 1
        elif up_to_date(made.get(clip_path(clip)), found, digest):
            done += 1
        else:
            todo.append({"src": found[0], "out": clip_path(clip), "size": found[1], "mtime_ns": found[2],
                         "trim": None if whole is None else [clip.start, clip.end], "length": clip.end - clip.start})
        rows.append([clip_path(clip), clip.split, clip.label, clip.youtube_id, clip.start, clip.end, planned])
    rows += [[clip_path(c), c.split, c.label, c.youtube_id, c.start, c.end, reason] for c, reason in again]
    shares = share_out(todo, nodes)
    os.makedirs(out_dir, exist_ok=True)
    for stale in [*Path(out_dir).glob("*.json"), *Path(out_dir).glob("*.list")]:
        stale.unlink()
    for node in nodes:
        jobs = shares[node["name"]]
        if jobs:
            Path(out_dir, f"{node['name']}.list").write_bytes(b"".join(os.fsencode(j["src"]) + b"\0" for j in jobs))
            Path(out_dir, f"{node['name']}.json").write_text(json.dumps(node_spec(node, layout, options, jobs)))
    Path(out_dir, "catalog.json").write_text(json.dumps({"classes": class_names(clips), "rows": rows}))
    per_node = {name: {"jobs": len(jobs), "bytes": sum(j["size"] for j in jobs)} for name, jobs in shares.items()}
    return {"clips": len(clips), "done": done, "todo": len(todo), "missing": missing, "again": len(again),
            "classes": len(class_names(clips)), "nodes": per_node,
            "text": plan_text(len(clips), done, todo, missing, per_node)}


def node_spec(node: dict[str, Any], layout: dict[str, Any], options: Options,
              jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """A node's jobs.json: its clips, where it reads their sources (SRC itself, or WORK/in: fetched from the holder
    node, or pushed by the controller) and where it writes (DEST itself, or WORK/out, sent to the collector)."""
    in_place, holder = node["in_place"], layout["holder"]
    return {"node": node["name"], "token": layout["token"], "options": asdict(options), "jobs": jobs,
            "src": layout["src"] if in_place else None,
            "fetch": {"host": holder, "handle": layout["src_handle"]} if not in_place and holder else None,
            "dest": layout["dest"] if node["writes_dest"] else None,
            "send": None if node["writes_dest"] else {"host": layout["collector"], "handle": layout["dest_handle"]}}


def up_to_date(made: dict[str, Any] | None, found: tuple[str, int, int], digest: str) -> bool:
    """Whether a clip's state says it was made (or found bad) from this very source with these options: then it is
    not made again (a clip that could not be made is tried again only when its source or the options change)."""
    return made is not None and made["source"] == list(found) and made["options"] == digest


def share_out(todo: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each node's share: the largest sources first, each to the node with the least work per CPU so far."""
    shares: dict[str, list[dict[str, Any]]] = {node["name"]: [] for node in nodes}
    load = {node["name"]: 0.0 for node in nodes}
    cpus = {node["name"]: max(int(node["cpus"]), 1) for node in nodes}
    for job in sorted(todo, key=lambda j: (-j["size"], j["out"])):
        name = min(load, key=lambda n: (load[n] + job["size"] / cpus[n], n))
        load[name] += job["size"] / cpus[name]
        shares[name].append(job)
    return shares


def plan_text(clips: int, done: int, todo: list[dict[str, Any]], missing: int, per_node: dict[str, Any]) -> str:
    share = ", ".join(f"{name} {n['jobs']} ({human(n['bytes'])})" for name, n in per_node.items() if n["jobs"])
    head = f"{clips} clips listed: {done} made already, {missing} missing from the source"
    if not todo:
        return f"{head}; nothing to make."
    return f"{head}; {len(todo)} to make ({human(sum(j['size'] for j in todo))} of sources): {share}."


def human(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} B"


# ---------------------------------------------------------------------------------------------------------------------
# Making one clip (on a node)


def run_tool(argv: list[str], deadline: float, timeout: float) -> subprocess.CompletedProcess[str]:
    """ffmpeg or ffprobe, killed when the clip's deadline (time.monotonic()) passes: PrepareError "making the clip
    took longer than N s" (``timeout``: the clip's limit), naming the tool. SIGKILL: ffmpeg reloading a live
    playlist does not heed SIGTERM."""
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False,
                              timeout=max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        raise PrepareError(f"making the clip took longer than {timeout:g} s ({argv[0]} was still running)") from None


def tool_error(stderr: str, fallback: str) -> str:
    """ffmpeg's or ffprobe's reason in one line: what the whitelists refused, else its last error line."""
    lines = stderr.strip().splitlines()
    refused = next((line for line in lines if "not on whitelist" in line), None)
    if refused is not None:
        demuxer = refused.split(" @ ")[0].lstrip("[")
        return f"not a video of a dataset's formats ({demuxer}; only {DEMUXERS} are read, and only the file itself)"
    return lines[-1] if lines else fallback


def ffprobe(path: str, deadline: float, timeout: float, *entries: str) -> dict[str, Any]:
    """ffprobe's JSON of the first video stream and the format; PrepareError with its first error line."""
    done = run_tool(["ffprobe", "-v", "error", *INPUT_ONLY, "-select_streams", "v:0", "-show_entries",
                     ":".join(entries), "-of", "json", path], deadline, timeout)
    if done.returncode != 0:
        raise PrepareError(tool_error(done.stderr, f"ffprobe exits {done.returncode}"))
    return json.loads(done.stdout or "{}")


def ffmpeg_argv(src: str, out: str, trim: list[float] | None, options: Options) -> list[str]:
    """The clip's transcode: trimmed (a whole video), at the frame rate, the short side scaled to ``short_side``
    (aspect kept, even), H.264 with a keyframe every ``keyint`` frames and none on scene cuts, no audio or other
    streams, one thread (a node runs one ffmpeg per CPU)."""
    s = options.short_side
    scale = f"scale=w='if(lte(iw,ih),{s},-2)':h='if(lte(iw,ih),-2,{s})'"
    seek = ["-ss", f"{trim[0]:g}"] if trim else []
    length = ["-t", f"{trim[1] - trim[0]:g}"] if trim else []
    return ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "error", "-y", "-threads", "1", *INPUT_ONLY, *seek,
            "-i", src, *length, "-map", "0:v:0", "-an", "-sn", "-dn", "-vf", f"fps={options.fps},{scale}",
            "-filter_threads", "1", "-c:v", "libx264", "-preset", options.preset, "-crf", str(options.crf),
            "-g", str(options.keyint), "-keyint_min", str(options.keyint), "-sc_threshold", "0",
            "-pix_fmt", "yuv420p", "-threads", "1", "-movflags", "+faststart", "-f", "mp4", out]


def shortfall(job: dict[str, Any], duration: float | None, options: Options) -> str | None:
    """Why a source cannot fill its clip's time range, or None."""
    if duration is None:
        return None
    covered = duration if job["trim"] is None else min(duration, job["trim"][1]) - job["trim"][0]
    if covered >= job["length"] - options.shortfall:
        return None
    if job["trim"] is None:
        return f"shorter than the clip ({duration:.1f} s of {job['length']:g} s)"
    return f"shorter than the clip (the video ends at {duration:.1f} s, the clip at {job['trim'][1]:g} s)"


def make_clip(job: dict[str, Any], src_dir: str, out_dir: str, options: Options) -> dict[str, Any]:
    """Make one clip, by the deadline options.timeout; its result record (the state's entry, with "out")."""
    result: dict[str, Any] = {"out": job["out"], "source": [job["src"], job["size"], job["mtime_ns"]],
                              "options": options.digest(), "ok": False, "reason": "", "frames": 0, "file": None}
    out = os.path.join(out_dir, job["out"])
    try:
        result.update(transcode(job, os.path.join(src_dir, job["src"]), out, options,
                                time.monotonic() + options.timeout))
    except PrepareError as exc:
        result["reason"] = str(exc)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(out)  # an older clip of a source that changed
    return result


def transcode(job: dict[str, Any], src: str, out: str, options: Options, deadline: float) -> dict[str, Any]:
    try:
        info = ffprobe(src, deadline, options.timeout, "stream=codec_name", "format=duration")
    except PrepareError as exc:
        raise PrepareError(f"cannot open: {exc}") from None
    if not info.get("streams"):
        raise PrepareError("cannot open: no video stream")
    duration = info.get("format", {}).get("duration")
    short = shortfall(job, None if duration in (None, "N/A") else float(duration), options)
    if short:
        raise PrepareError(short)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    tmp = os.path.join(os.path.dirname(out), TMP_PREFIX + os.path.basename(out))
    try:
        done = run_tool(ffmpeg_argv(src, tmp, job["trim"], options), deadline, options.timeout)
        if done.returncode != 0:
            raise PrepareError(f"transcoding failed: {tool_error(done.stderr, 'no message')}")
        frames = int(ffprobe(tmp, deadline, options.timeout, "stream=nb_frames").get("streams", [{}])[0]
                     .get("nb_frames") or 0)
        if frames == 0:
            raise PrepareError("transcoding made no frames")
    except PrepareError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    os.replace(tmp, out)
    st = os.stat(out)
    return {"ok": True, "frames": frames, "file": [st.st_size, st.st_mtime_ns, manifest.sha256_file(os.fsencode(out))]}


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


def not_listed_because(planned: str | None, entry: dict[str, Any] | None) -> str | None:
    """Why a catalog row is not in the lists, None when it is (made): the plan's reason first ("missing from the
    source"; "listed twice": a state entry for that output is the other listing's), else why the clip could not be
    made, else that the run stopped before it."""
    if planned is not None:
        return planned
    if entry is None:
        return "not made yet (the run stopped first)"
    return None if entry["ok"] else entry["reason"]


def lists(catalog_file: str, state_file: str, out: str) -> dict[str, Any]:
    """The GluonCV lists (one per split), classInd.txt and report.json, from the catalog and DEST's state (on the
    controller, in the trainer's package: the lists' format is trainer.data.annotations')."""
    from trainer.data.annotations import annotation_line, write_class_index

    with open(catalog_file, encoding="utf-8") as f:
        catalog = json.load(f)
    outputs = read_state(state_file)
    classes: list[str] = catalog["classes"]
    label_of = {name: i for i, name in enumerate(classes)}
    lines: dict[str, list[str]] = {}
    bad: list[dict[str, Any]] = []
    totals: dict[str, dict[str, dict[str, int]]] = {}
    for out_rel, split, label, youtube_id, start, end, planned in catalog["rows"]:
        entry = outputs.get(out_rel)
        count = totals.setdefault(split, {}).setdefault(label, {"listed": 0, "made": 0, "bad": 0})
        count["listed"] += 1
        lines.setdefault(split, [])
        reason = not_listed_because(planned, entry)
        if reason is None:
            count["made"] += 1
            lines[split].append(annotation_line(out_rel, outputs[out_rel]["frames"], label_of[label]))
            continue
        count["bad"] += 1
        bad.append({"split": split, "label": label, "youtube_id": youtube_id, "time_start": start,
                    "time_end": end, "clip": out_rel, "reason": reason})
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for split, split_lines in lines.items():
        Path(out, f"{split}{LIST_SUFFIX}").write_text("".join(split_lines), encoding="utf-8")
    write_class_index(Path(out, CLASS_INDEX), classes)
    Path(out, REPORT).write_text(report_text(totals, bad), encoding="utf-8")
    summary = {split: {k: sum(c[k] for c in per_class.values()) for k in ("listed", "made", "bad")}
               for split, per_class in sorted(totals.items())}
    text = "; ".join(f"{split}: {n['made']} of {n['listed']} clips made, {n['bad']} not" for split, n in
                     summary.items())
    return {"files": sorted(p.name for p in Path(out).iterdir()), "totals": summary, "bad": len(bad),
            "examples": bad[:5], "text": f"{text}; {len(classes)} classes."}


def report_text(totals: dict[str, dict[str, dict[str, int]]], bad: list[dict[str, Any]]) -> str:
    """report.json: totals per split and class, then every clip not made with its reason, one a line."""
    head = json.dumps({"totals": {split: dict(sorted(per.items())) for split, per in sorted(totals.items())}})
    rows = ",\n".join(json.dumps(row) for row in sorted(bad, key=lambda row: row["clip"]))
    return f'{head[:-1]}, "bad": [\n{rows}\n]}}\n'


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
    """What a command (other than run) prints, as JSON."""
    if args.command == "probe":
        return probe(args.src, args.work, args.index)
    if args.command == "deliver":
        return deliver(args.work)
    if args.command == "state":
        return fold_state(args.dest, args.work)
    if args.command == "seal":
        return seal(args.dest, args.source, args.work)
    if args.command == "plan":
        with open(args.layout, encoding="utf-8") as f:
            layout = json.load(f)
        return plan(args.csv, args.index, args.state, layout, Options.from_json(json.loads(args.options)), args.out)
    return lists(args.catalog, args.state, args.out)


def main(argv: list[str]) -> int:
    """Bad input ends a command with one "error: ..." line on stderr and status 2."""
    args = parser().parse_args(argv)
    try:
        if args.command == "run":
            return run_detached(args.work, args.detach)
        print(json.dumps(answer(args)))
    except (PrepareError, manifest.ManifestError, OSError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
