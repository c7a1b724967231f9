"""Making one clip of a dataset being prepared (trainer/data/prepare.py), on a node: how every clip is made
(``Options``), ffmpeg and ffprobe run to the clip's deadline, the checks of a source and of what was made.

Standard library only, and carried to the nodes with prepare.py and manifest.py (roles/prepare_data's loader makes
this file's source the module trainer.data.transcode): nothing is installed there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import time
from dataclasses import asdict, dataclass
from typing import Any

from trainer.data import manifest

TMP_PREFIX = ".vidcluster-tmp-"
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
