"""trainer/data/prepare.py's parts that need no cluster: bad input refused by name, the plan's shares, a source too
short for its clip. The whole preparation, on real nodes with real videos: tests/cluster/test_prepare_data.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainer.data.annotations import AnnotationError, read_kinetics_csv
from trainer.data.prepare import Options, PrepareError, main, share_out, shortfall

HEADER = "label,youtube_id,time_start,time_end,split,is_cc\n"


@pytest.mark.parametrize(("text", "message"), [
    ("label,youtube_id,time_start,split\n", "no column time_end (a Kinetics-style CSV's header is "
                                            "label,youtube_id,time_start,time_end,split)"),
    (HEADER + "abseiling,abc,ten,20,train,0\n", ":2: time_start must be a number, got 'ten'"),
    (HEADER + "abseiling,abc,20,10,train,0\n", ":2: time_end 10 is not after time_start 20"),
    (HEADER + "a/b,abc,0,10,train,0\n", ":2: label 'a/b' cannot name a folder"),
    (HEADER + "abseiling,abc,0\n", ":2: 6 fields expected, fewer found"),
])
def test_a_bad_csv_is_refused_naming_the_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "train.csv"
    path.write_text(text)
    with pytest.raises(AnnotationError) as caught:
        list(read_kinetics_csv(path))
    assert str(caught.value).startswith(str(path)) and message in str(caught.value)


def test_the_plan_command_says_what_is_wrong_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "train.csv").write_text(HEADER + "abseiling,abc,0,10,train,0\n")
    (tmp_path / "index.json").write_text("[]")
    (tmp_path / "layout.json").write_text(json.dumps({"nodes": ["n0"], "cpus": {"n0": 1}, "in_place": ["n0"],
                                                      "writers": ["n0"]}))
    argv = ["plan", str(tmp_path / "train.csv"), "--index", str(tmp_path / "index.json"), "--state",
            str(tmp_path / "none.json"), "--layout", str(tmp_path / "layout.json"), "--out", str(tmp_path / "plan")]
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
