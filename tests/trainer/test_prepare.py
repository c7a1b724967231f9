"""trainer/data/prepare.py's parts that need no cluster: bad input refused by name, the plan's shares, a source too
short for its clip, what is made again, a playlist among the sources, a node's run on real videos (ffmpeg).
The whole preparation, on real nodes: tests/cluster/test_prepare_data.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.conftest import ffmpeg
from tests.trainer.playlists import live_playlist
from trainer.data.annotations import AnnotationError, read_kinetics_csv
from trainer.data.prepare import (
    STALL_MARGIN,
    fold_state,
    read_state,
    stalled,
    state_text,
    still_made,
)
from trainer.data.prepare_plan import lists, main, not_listed_because, share_out, up_to_date
from trainer.data.transcode import Options, PrepareError, run_tool, shortfall

REPO = Path(__file__).resolve().parents[2]

HEADER = "label,youtube_id,time_start,time_end,split,is_cc\n"


@pytest.mark.parametrize(("text", "message"), [
    ("label,youtube_id,time_start,split\n", "no column time_end (a Kinetics-style CSV's header is "
                                            "label,youtube_id,time_start,time_end,split)"),
    (HEADER + "abseiling,abc,ten,20,train,0\n", ":2: time_start must be a number, got 'ten'"),
    (HEADER + "abseiling,abc,20,10,train,0\n", ":2: time_end 10 is not after time_start 20"),
    (HEADER + "a/b,abc,0,10,train,0\n", ":2: label 'a/b' cannot name a folder"),
    (HEADER + "abseiling,abc,0\n", ":2: 6 fields expected, fewer found"),
    # a newline would forge a list entry ("train/abseiling 90 0") and a class name
    (HEADER + '"abseiling 90 0\nx",abc,0,10,train,0\n', ":3: label 'abseiling 90 0\\nx' holds a control character"),
    (HEADER + "abseiling,ab\tc,0,10,train,0\n", ":2: youtube_id 'ab\\tc' holds a control character"),
    (HEADER + '"abseiling, outdoors",abc,0,10,train,0\n', ":2: label 'abseiling, outdoors' holds a comma"),
    (HEADER + "#abseiling,abc,0,10,train,0\n", ":2: label '#abseiling' starts with '#'"),
    (HEADER + "abseiling,abc,0,10,#train,0\n", ":2: split '#train' starts with '#'"),
])
def test_a_bad_csv_is_refused_naming_the_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "train.csv"
    path.write_text(text)
    with pytest.raises(AnnotationError) as caught:
        list(read_kinetics_csv(path))
    assert str(caught.value).startswith(str(path)) and message in str(caught.value)
    assert len(str(caught.value).splitlines()) == 1


def plan_argv(tmp_path: Path, csv_text: str) -> list[str]:
    """The plan command on one CSV, an empty source and one node."""
    (tmp_path / "train.csv").write_text(csv_text)
    (tmp_path / "index.json").write_text("[]")
    (tmp_path / "layout.json").write_text(json.dumps({"nodes": ["n0"], "cpus": {"n0": 1}, "in_place": ["n0"],
                                                      "writers": ["n0"]}))
    return ["plan", str(tmp_path / "train.csv"), "--index", str(tmp_path / "index.json"), "--state",
            str(tmp_path / "none.json"), "--layout", str(tmp_path / "layout.json"), "--out", str(tmp_path / "plan")]


@pytest.mark.parametrize("split", ["classInd", "report.json", "train.txt"])
def test_a_split_that_would_overwrite_the_datasets_own_files_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], split: str) -> None:
    argv = plan_argv(tmp_path, HEADER + "abseiling,abc,0,10,train,0\n" + f"abseiling,abd,0,10,{split},0\n")
    assert main([*argv, "--options", "{}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {tmp_path / 'train.csv'}:3: split {split!r} would overwrite the dataset's own "
                          "files (classInd.txt, report.json, the lists <split>.txt)"), err
    assert len(err.splitlines()) == 1


def test_the_plan_command_says_what_is_wrong_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = plan_argv(tmp_path, HEADER + "abseiling,abc,0,10,train,0\n")
    for options, message in (({"preset": "quick"}, "error: preset must be one of x264's (ultrafast, "),
                             ({"short_side": 255}, "error: short_side must be an even number of pixels"),
                             ({"frame_rate": 30}, "error: unknown option(s): frame_rate")):
        assert main([*argv, "--options", json.dumps(options)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(message) and len(err.splitlines()) == 1, err
    assert main([*argv, "--options", "{}"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["missing"] == 1 and summary["todo"] == 0


def test_shares_follow_the_nodes_cpus_largest_sources_first() -> None:
    jobs = [{"out": f"c{i}", "size": size} for i, size in enumerate([90, 10, 40, 60, 30, 30, 20, 20])]
    nodes = [{"name": "big", "cpus": 3}, {"name": "small", "cpus": 1}]
    shares = share_out(jobs, nodes)
    assert sorted(j["out"] for share in shares.values() for j in share) == sorted(j["out"] for j in jobs)
    load = {name: sum(j["size"] for j in share) for name, share in shares.items()}
    assert load == {"big": 230, "small": 70}  # 3 CPUs take about three times the bytes of one
    assert shares["big"][0]["size"] == 90  # the largest goes first


def test_a_source_may_fall_short_of_its_clip_by_the_allowance_only() -> None:
    options = Options(shortfall=1.0)
    whole = {"trim": [5.0, 15.0], "length": 10.0}
    assert shortfall(whole, 14.2, options) is None
    assert shortfall(whole, 13.0, options) == "shorter than the clip (the video ends at 13.0 s, the clip at 15 s)"
    trimmed = {"trim": None, "length": 10.0}
    assert shortfall(trimmed, 9.5, options) is None
    assert shortfall(trimmed, 6.25, options) == "shorter than the clip (6.2 s of 10 s)"
    assert shortfall(trimmed, None, options) is None  # a container that does not say: ffmpeg's own check decides
    with pytest.raises(PrepareError, match="short_side must be an even number"):
        Options(short_side=0).check()


# ---------------------------------------------------------------------------------------------------------------------
# What is made again: the redo rules


def entry(ok: bool, source: list[Any], options: str, size: int = 100, mtime_ns: int = 5) -> dict[str, Any]:
    """A state entry as a node's run records it."""
    return {"source": source, "options": options, "ok": ok, "reason": "" if ok else "cannot open: broken",
            "frames": 90 if ok else 0, "file": [size, mtime_ns, "ab" * 32] if ok else None}


def test_a_clip_is_made_again_only_when_its_source_or_the_options_changed() -> None:
    found = ("train/abc.mp4", 1000, 7)
    digest = Options().digest()
    assert not up_to_date(None, found, digest)  # never made
    assert up_to_date(entry(True, list(found), digest), found, digest)
    assert not up_to_date(entry(True, list(found), Options(crf=30).digest()), found, digest)  # other options
    assert not up_to_date(entry(True, ["train/abc.mp4", 1001, 7], digest), found, digest)  # the source changed
    assert not up_to_date(entry(True, ["train/abc.mp4", 1000, 8], digest), found, digest)
    # one that could not be made is not tried again on every run: only when its source or the options change
    assert up_to_date(entry(False, list(found), digest), found, digest)
    assert not up_to_date(entry(False, list(found), Options(fps=25).digest()), found, digest)
    assert Options(timeout=5, jobs=3).digest() == digest  # how fast a clip is made is no reason to make it again


def test_a_made_clip_whose_file_went_missing_or_changed_size_is_forgotten() -> None:
    assert still_made(entry(True, [], ""), (100, 5))
    assert not still_made(entry(True, [], ""), None)  # gone
    assert not still_made(entry(True, [], ""), (99, 5))  # resized: another file now
    moved = entry(True, [], "")
    assert still_made(moved, (100, 9)) and moved["file"][1] == 9  # rsync -t: the same content, its mtime taken
    assert still_made(entry(False, [], ""), None)  # a clip that could not be made has no file


def test_fold_state_forgets_missing_and_resized_clips(tmp_path: Path) -> None:
    dest, work = tmp_path / "dest", tmp_path / "work"
    (dest / "train/a").mkdir(parents=True)
    for name in ("kept", "resized"):
        (dest / f"train/a/{name}.mp4").write_bytes(b"x" * 100)
    outputs = {f"train/a/{name}.mp4": entry(True, [], "", size=100) for name in ("kept", "resized", "gone")}
    outputs["train/a/bad.mp4"] = entry(False, [], "")
    (dest / ".vidcluster-prepare").mkdir()
    (dest / ".vidcluster-prepare/state.json").write_text(state_text(outputs))
    (dest / "train/a/resized.mp4").write_bytes(b"x" * 50)
    assert fold_state(str(dest), str(work))["changed"]
    assert sorted(read_state(str(dest / ".vidcluster-prepare/state.json"))) == ["train/a/bad.mp4", "train/a/kept.mp4"]


def test_a_row_not_in_the_lists_says_why() -> None:
    made = entry(True, [], "")
    assert not_listed_because(None, made) is None
    assert not_listed_because("missing from the source", None) == "missing from the source"
    # the state's entry for that output is the other listing's
    assert not_listed_because("listed twice (also a.csv:2)", made) == "listed twice (also a.csv:2)"
    assert not_listed_because(None, entry(False, [], "")) == "cannot open: broken"
    assert not_listed_because(None, None) == "not made yet (the run stopped first)"


def test_the_report_keeps_the_plans_reasons(tmp_path: Path) -> None:
    rows = [["train/a/x.mp4", "train", "a", "x", 0, 3, None], ["train/a/y.mp4", "train", "a", "y", 0, 3,
            "missing from the source"], ["train/a/x.mp4", "train", "a", "x", 0, 3, "listed twice (also t.csv:2)"]]
    (tmp_path / "catalog.json").write_text(json.dumps({"classes": ["a"], "rows": rows}))
    (tmp_path / "state.json").write_text(state_text({"train/a/x.mp4": entry(True, [], "")}))
    summary = lists(str(tmp_path / "catalog.json"), str(tmp_path / "state.json"), str(tmp_path / "out"))
    assert summary["files"] == ["classInd.txt", "report.json", "train.txt"]
    assert (tmp_path / "out/train.txt").read_text() == "train/a/x.mp4 90 0\n"
    report = json.loads((tmp_path / "out/report.json").read_text())
    assert [(row["clip"], row["reason"]) for row in report["bad"]] == [
        ("train/a/x.mp4", "listed twice (also t.csv:2)"), ("train/a/y.mp4", "missing from the source")]


# ---------------------------------------------------------------------------------------------------------------------
# Probes and transcodes under the clip's deadline; a playlist among the sources


def test_a_run_in_which_no_clip_finishes_for_longer_than_a_clip_may_take_is_ended_naming_them() -> None:
    state = {"phase": "transcoding", "making": ["b.mp4", "a.mp4"]}
    assert stalled(state, 20 + STALL_MARGIN, 20) is None
    assert stalled(state, 21 + STALL_MARGIN, 20) == (
        f"no clip finished for {21 + STALL_MARGIN:.0f} s (a clip may take 20 s); still making: a.mp4, b.mp4")
    assert stalled({**state, "phase": "fetching"}, 1000, 20) is None  # rsync's time is the sources' size


def test_the_heartbeat_ends_a_run_in_which_no_clip_finishes_and_says_why(tmp_path: Path) -> None:
    """A run stuck outside every clip's deadline: its beat writes the reason and kills its process group (the run
    and its ffmpegs), so the play's watch sees it end instead of a heartbeat that goes on for ever."""
    path = tmp_path / "progress.json"
    stuck = ("import sys; from trainer.data.prepare import Progress; p = Progress(sys.argv[1], 2, 0.5); "
             "p.update(phase='transcoding'); p.making('raw/a.mp4', started=True); p.beat()")
    done = subprocess.run([sys.executable, "-c", stuck, str(path)], cwd=REPO, start_new_session=True, timeout=120)
    assert done.returncode == -9  # SIGKILL, from its own beat
    state = json.loads(path.read_text())
    assert state["finished"] and state["rc"] == 1, state
    assert state["error"].startswith("no clip finished for ") and state["error"].endswith(
        " s (a clip may take 0.5 s); still making: raw/a.mp4"), state


def test_a_tool_running_past_the_clips_deadline_is_killed_and_named(tmp_path: Path) -> None:
    playlist = live_playlist(tmp_path / "src/live.mp4", tmp_path / "private")
    started = time.monotonic()
    with pytest.raises(PrepareError) as caught:  # ffmpeg without the whitelists: it waits for the next segment
        run_tool(["ffmpeg", "-v", "error", "-i", str(playlist), "-f", "null", "-"], time.monotonic() + 1.5, 1.5)
    assert str(caught.value) == "making the clip took longer than 1.5 s (ffmpeg was still running)"
    assert time.monotonic() - started < 1.5 + 10


def write_run(work: Path, src: Path, dest: Path, jobs: list[dict[str, Any]], options: Options) -> None:
    """A node's share (jobs.json) that reads SRC in place and writes DEST itself."""
    work.mkdir(parents=True)
    (work / "jobs.json").write_text(json.dumps({"node": "n0", "token": "t", "options": options.__dict__, "jobs": jobs,
                                                "src": str(src), "fetch": None, "dest": str(dest), "send": None}))


def job(src: Path, rel: str, out: str) -> dict[str, Any]:
    st = (src / rel).stat()
    return {"src": rel, "out": out, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "trim": None, "length": 2}


def test_a_node_run_with_live_playlists_among_its_sources_ends_at_once_naming_them(tmp_path: Path) -> None:
    """Two playlists named like clips (a crafted source), their segments a private file: neither is read (ffprobe and
    ffmpeg read the dataset's formats from the file itself only), each named with its reason; the video is made."""
    src, dest, work = tmp_path / "src", tmp_path / "dest", tmp_path / "work"
    ffmpeg("-f", "lavfi", "-i", "testsrc2=size=64x48:rate=25:duration=2", "-c:v", "libx264", "-preset", "ultrafast",
           str(src / "good_000000_000002.mp4") if src.mkdir() is None else "")
    live_playlist(src / "live_000000_000002.mp4", tmp_path / "private")
    live_playlist(src / "also_000000_000002.mkv", tmp_path / "private")
    unguarded = subprocess.run(["ffprobe", "-v", "error", "-show_entries", "stream=codec_name", "-of", "csv=p=0",
                                str(src / "live_000000_000002.mp4")], capture_output=True, text=True, timeout=60)
    assert "h264" in unguarded.stdout  # what a plain ffprobe does: it reads the private file
    jobs = [job(src, name, f"train/a/{name.split('.')[0]}.mp4") for name in
            ("good_000000_000002.mp4", "live_000000_000002.mp4", "also_000000_000002.mkv")]
    limit = 30.0
    write_run(work, src, dest, jobs, Options(short_side=32, fps=10, preset="ultrafast", timeout=limit, jobs=2))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "trainer.data.prepare", "run", str(work)], cwd=REPO,
                          capture_output=True, text=True, timeout=limit + 60)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < limit + STALL_MARGIN
    progress = json.loads((work / "progress.json").read_text())
    assert progress["finished"] and progress["rc"] == 0 and (progress["made"], progress["bad"]) == (1, 2)
    results = {r["out"]: r for path in (dest / ".vidcluster-prepare/results").glob("*.jsonl")
               for r in map(json.loads, path.read_text().splitlines())}
    assert results["train/a/good_000000_000002.mp4"]["ok"]
    for name in ("live_000000_000002", "also_000000_000002"):
        reason = results[f"train/a/{name}.mp4"]["reason"]
        assert reason.startswith("cannot open: not a video of a dataset's formats (hls; only mov,mp4,"), reason
    assert not (dest / "train/a/live_000000_000002.mp4").exists()
    assert sorted(os.listdir(dest / "train/a")) == ["good_000000_000002.mp4"]
