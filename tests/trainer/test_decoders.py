"""trainer.data.decoders: decord and torchcodec give the same frames for the same indices.

Videos are encoded here by Debian's ffmpeg in H.264 (with B-frames), HEVC, VP9, AV1 and lossless RGB (FFV1), with
8-frame GOPs. Ground truth for "frame i" is the i-th frame of a plain sequential decode by the ffmpeg command line
(no seeking); random access must give exactly that frame.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.trainer.conftest import AV1, ffmpeg
from tests.trainer.test_data import make_cfg, write_list
from trainer.config import ConfigError, validate_config
from trainer.data import build_dataset, check_dataset, write_annotations_from_tree
from trainer.data.decoders import BadVideo, decode_device, open_reader, read_frames, resize_frames
from trainer.data.synthetic import render_video
from trainer.node_checks import check_runtime

WIDTH, HEIGHT, FRAMES = 64, 48, 24
SMALLER = (40, 32)  # a decode size (NEW_WIDTH, NEW_HEIGHT) below the native one
GOP = ["-g", "8"]
ENCODINGS: dict[str, tuple[str, list[str]]] = {
    "h264": ("mp4", ["-c:v", "libx264", "-preset", "veryfast", "-bf", "3", "-pix_fmt", "yuv420p", *GOP]),
    "h264_lossless": ("mp4", ["-c:v", "libx264", "-preset", "ultrafast", "-qp", "0", "-pix_fmt", "yuv420p", *GOP]),
    # Closed GOPs: decord 0.6 seeks HEVC's open GOPs (x265's default) inexactly, see the last test.
    "hevc": ("mp4", ["-c:v", "libx265", "-preset", "ultrafast", "-x265-params", "log-level=none:open-gop=0",
                     "-pix_fmt", "yuv420p", *GOP]),
    "hevc_open_gop": ("mp4", ["-c:v", "libx265", "-preset", "ultrafast", "-x265-params", "log-level=none",
                              "-pix_fmt", "yuv420p", *GOP]),
    "vp9": ("webm", ["-c:v", "libvpx-vp9", "-deadline", "realtime", "-cpu-used", "8", "-pix_fmt", "yuv420p", *GOP]),
    "rgb_lossless": ("mkv", ["-c:v", "ffv1", "-pix_fmt", "bgr0", *GOP]),
    "av1": ("mkv", AV1),
    "av1_lossless": ("mkv", [*AV1, "-aom-params", "lossless=1"]),
}  # fmt: skip
BOTH = ["h264", "h264_lossless", "hevc", "vp9", "rgb_lossless"]  # what decord reads exactly
CHROMA_420 = ["h264", "h264_lossless", "hevc", "vp9"]
# Unsorted, repeated, across key frames, first and last.
INDICES = np.array([23, 0, 7, 8, 9, 15, 16, 3, 3, 12])


@pytest.fixture(scope="module")
def source() -> np.ndarray:
    """The frames every test video encodes: [24, 48, 64, 3] uint8, a moving square over a flickering texture."""
    return np.ascontiguousarray(render_video((1, 1), WIDTH, FRAMES, np.random.default_rng(0))[:, :HEIGHT])


@pytest.fixture(scope="module")
def videos(source: np.ndarray, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("codecs")
    paths = {}
    for name, (ext, args) in ENCODINGS.items():
        paths[name] = str(out / f"{name}.{ext}")
        ffmpeg("-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{WIDTH}x{HEIGHT}", "-r", "8", "-i", "-", *args,
               paths[name], data=source.tobytes())  # fmt: skip
    return paths


def reference(path: str) -> torch.Tensor:
    """Every frame of a sequential decode by the ffmpeg command line, in RGB with swscale's bilinear filter."""
    raw = ffmpeg("-i", path, "-f", "rawvideo", "-pix_fmt", "rgb24", "-sws_flags", "bilinear", "-")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(-1, HEIGHT, WIDTH, 3)


def decode(backend: str, path: str, size: tuple[int, int] = (-1, -1)) -> torch.Tensor:
    return read_frames(open_reader(backend, path, size), INDICES)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_torchcodec_gives_frame_i_for_index_i(videos: dict[str, str], name: str) -> None:
    truth = reference(videos[name])
    assert len(open_reader("torchcodec", videos[name])) == len(truth) == FRAMES
    assert torch.equal(decode("torchcodec", videos[name]), truth[INDICES])


@pytest.mark.parametrize("name", BOTH)
def test_decord_and_torchcodec_give_identical_frames(videos: dict[str, str], name: str) -> None:
    assert len(open_reader("decord", videos[name])) == len(open_reader("torchcodec", videos[name]))
    frames = decode("decord", videos[name])
    assert torch.equal(frames, decode("torchcodec", videos[name]))
    assert torch.equal(frames, reference(videos[name])[INDICES])


def test_lossless_videos_decode_to_their_source(videos: dict[str, str], source: np.ndarray) -> None:
    for backend in ("decord", "torchcodec"):
        assert torch.equal(decode(backend, videos["rgb_lossless"]), torch.from_numpy(source[INDICES]))
    # The same YUV 4:2:0 pictures, losslessly in AV1 (torchcodec only) and H.264: the same RGB frames.
    assert torch.equal(decode("torchcodec", videos["av1_lossless"]), decode("decord", videos["h264_lossless"]))


def test_decord_cannot_open_av1(videos: dict[str, str]) -> None:
    for name in ("av1", "av1_lossless"):
        with pytest.raises(BadVideo, match=r"^cannot open: .*cannot find video stream"):
            open_reader("decord", videos[name])


@pytest.mark.parametrize("name", [*CHROMA_420, "rgb_lossless"])
def test_decode_size_gives_the_same_geometry_and_frames(videos: dict[str, str], name: str) -> None:
    """NEW_WIDTH x NEW_HEIGHT: decord scales YUV then converts, torchcodec converts then scales RGB (both bilinear).
    Identical for RGB video; for 4:2:0 the chroma is interpolated differently, a few levels on average."""
    ours, theirs = decode("decord", videos[name], SMALLER), decode("torchcodec", videos[name], SMALLER)
    assert ours.shape == theirs.shape == (len(INDICES), SMALLER[1], SMALLER[0], 3)
    diff = (ours.int() - theirs.int()).abs()
    if name == "rgb_lossless":
        assert diff.max() == 0
        return
    assert diff.float().mean() < 4.0, diff.float().mean()
    # Still the same frames: each torchcodec frame is far nearer to decord's at its index than to any other.
    distance = (theirs[:, None].int() - ours[None].int()).abs().float().mean(dim=(2, 3, 4))
    assert (INDICES[distance.argmin(dim=1).numpy()] == INDICES).all()


def test_hevc_open_gops_are_frame_accurate_only_with_torchcodec(videos: dict[str, str]) -> None:
    truth = reference(videos["hevc_open_gop"])[INDICES]
    assert torch.equal(decode("torchcodec", videos["hevc_open_gop"]), truth)
    # decord 0.6 seeks to an open-GOP key frame and returns neighbouring frames; if this starts to fail, decord
    # has been fixed: say so in trainer/data/decoders.py.
    assert not torch.equal(decode("decord", videos["hevc_open_gop"]), truth)


# ----------------------------------------------------------------------------------------------------
# The dataset with CONFIG.DATA.DECODER


def dataset_items(data: dict[str, Any], split: str, **overrides: Any) -> list[dict[str, Any]]:
    dataset = build_dataset(make_cfg(data, **overrides), split)  # type: ignore[arg-type]
    keys = [(i, 1) for i in range(len(dataset))] if split == "train" else range(len(dataset))
    return [dataset[key] for key in keys]


@pytest.mark.parametrize("split", ["train", "val"])
def test_clips_are_identical_with_either_decoder(synthetic_dataset: dict[str, Any], split: str) -> None:
    """Same indices, crops, flips and normalisation: at the native size the clips are equal to the bit."""
    settings = {"KEEP_ASPECT_RATIO": True, "RANDOM_FLIP": True}
    ours = dataset_items(synthetic_dataset, split, DECODER="decord", **settings)
    theirs = dataset_items(synthetic_dataset, split, DECODER="torchcodec", **settings)
    assert len(ours) == len(theirs) == (24 if split == "train" else 12)
    for a, b in zip(ours, theirs, strict=True):
        assert a["index"] == b["index"] and a["label"] == b["label"] and "fallback" not in b
        assert torch.equal(a["video"], b["video"]), a["index"]


def test_auto_reads_what_decord_cannot_and_says_so(mixed_dataset: tuple[dict[str, Any], list[str]]) -> None:
    data, (*_, val_av1) = mixed_dataset
    by_decoder = {decoder: dataset_items(data, "val", DECODER=decoder) for decoder in ("decord", "auto")}
    bad = {item["bad"][0]: item["bad"][1] for item in by_decoder["decord"] if "bad" in item}
    assert list(bad) == [val_av1] and bad[val_av1].startswith("cannot open: ")
    auto = by_decoder["auto"]
    assert all("bad" not in item for item in auto) and len(auto) == 12
    assert [item["fallback"] for item in auto if "fallback" in item] == [(val_av1, bad[val_av1])]
    # The good videos are decoded by decord as before.
    for ours, theirs in zip(by_decoder["decord"], auto, strict=True):
        assert "bad" in ours or torch.equal(ours["video"], theirs["video"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="about a machine without a GPU, and one is visible here")
def test_gpu_decoding_falls_back_to_the_cpu_with_a_message(
    synthetic_dataset: dict[str, Any], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    decode_device.cache_clear()
    logger = logging.getLogger("trainer")
    monkeypatch.setattr(logger, "propagate", False)  # as setup_logging leaves it; caplog listens here instead
    logger.addHandler(caplog.handler)
    try:
        item = dataset_items(synthetic_dataset, "val", DECODER="torchcodec", DECODER_DEVICE="cuda")[0]
    finally:
        logger.removeHandler(caplog.handler)
    assert item["video"].device.type == "cpu" and "bad" not in item
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        "CONFIG.DATA.DECODER_DEVICE is cuda but no GPU is visible: torchcodec decodes on the CPU"
    ]


# ----------------------------------------------------------------------------------------------------
# Config and checks


def data_config(**data: Any) -> dict[str, Any]:
    return {"DDP_CONFIG": {"DISTRIBUTED": False}, "CONFIG": {"DATA": data}}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"DECODER": "ffmpeg"}, r"CONFIG\.DATA\.DECODER: Input should be 'decord', 'torchcodec' or 'auto'"),
        ({"DECODER": "auto", "DECODER_DEVICE": "cuda"}, r"DECODER_DEVICE: cuda decoding needs DECODER torchcodec"),
        ({"DECODER": "torchcodec", "DECODER_DEVICE": "cuda", "NUM_WORKERS": 2},
         r"DECODER_DEVICE: cuda decoding runs in the training process; set NUM_WORKERS to 0"),
    ],
)  # fmt: skip
def test_decoder_keys_are_validated_by_name(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_config(data_config(**data))


def test_runtime_check_needs_a_torchcodec_that_loads_ffmpeg(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchcodec

    cfg = validate_config(data_config(DECODER="torchcodec", DECODER_DEVICE="cuda"))
    check_runtime(cfg)  # this machine has Debian's FFmpeg libraries
    monkeypatch.setattr(torchcodec, "ffmpeg_major_version", None)  # what torchcodec says when it finds none
    with pytest.raises(ConfigError, match=r"^CONFIG\.DATA\.DECODER: torchcodec needs torchcodec, which cannot run "
                                          rf"here: torchcodec {re.escape(torchcodec.__version__)} finds no FFmpeg "
                                          "shared libraries"):
        check_runtime(cfg)
    check_runtime(validate_config(data_config(DECODER="decord")))


def test_a_decoder_that_cannot_run_is_one_error_line(
    synthetic_dataset: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where a command chose the decoder (make-annotations' --decoder, a checkpoint's recorded clip settings), before
    any video is read."""
    import torchcodec

    from trainer import checkpoint, predict
    from trainer.__main__ import main
    from trainer.models import build_model

    cfg = validate_config({"CONFIG": {"DATA": {"NUM_CLASSES": 2, "DECODER": "torchcodec"},
                                      "MODEL": {"NAME": "i3d_tiny"}}})  # fmt: skip
    trained = tmp_path / "best.pth"
    torch.save({"model": build_model("i3d_tiny", 2).state_dict(),
                "inference": checkpoint.inference_info(cfg, ["a", "b"])}, trained)  # fmt: skip
    monkeypatch.setattr(torchcodec, "ffmpeg_major_version", None)
    problem = rf"decoder torchcodec needs torchcodec: torchcodec {re.escape(torchcodec.__version__)} finds no FFmpeg"
    tree = str(Path(synthetic_dataset["TRAIN_DATA_PATH"], "train"))
    for run, chosen_by in (
        (lambda: main(["make-annotations", tree, "--out", str(tmp_path / "lists"), "--decoder", "torchcodec"]),
         "--decoder: "),
        (lambda: predict.main([str(tmp_path / "video.mp4"), "--checkpoint", str(trained)]), ""),
    ):  # fmt: skip
        with pytest.raises(SystemExit) as exit_info:
            run()
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1, err
        assert re.match(rf"error: {re.escape(chosen_by)}{problem}", err), err
    assert not (tmp_path / "lists").exists()


def test_check_names_whether_the_other_decoder_reads_a_bad_video(
    mixed_dataset: tuple[dict[str, Any], list[str]], tmp_path: Path
) -> None:
    data, av1 = mixed_dataset
    garbage = tmp_path / "garbage.mp4"
    garbage.write_bytes(np.random.default_rng(0).bytes(4096))
    anno = write_list(tmp_path / "list.txt", [*Path(data["TRAIN_ANNO_PATH"]).read_text().splitlines(),
                                               f"{garbage} 0", f"{tmp_path / 'missing.mp4'} 0"])  # fmt: skip
    root = data["TRAIN_DATA_PATH"]
    found = {decoder: dict(check_dataset(anno, root, decoder)) for decoder in ("decord", "torchcodec", "auto")}
    train_av1 = av1[:2]
    assert sorted(found["decord"]) == sorted([*train_av1, str(garbage), str(tmp_path / "missing.mp4")])
    for path in train_av1:
        assert re.fullmatch(r"cannot open: .*; torchcodec reads it", found["decord"][path]), found["decord"][path]
    assert found["decord"][str(garbage)].startswith("cannot open: Error reading")
    assert "; torchcodec cannot either (cannot open: Could not open input file" in found["decord"][str(garbage)]
    assert found["decord"][str(tmp_path / "missing.mp4")] == "missing file"
    assert found["torchcodec"][str(garbage)].endswith("; decord cannot either (cannot open: Error reading "
                                                      f"{garbage}...)")
    assert sorted(found["torchcodec"]) == sorted(found["auto"]) == [str(garbage), str(tmp_path / "missing.mp4")]
    assert found["auto"][str(garbage)].startswith("decord: cannot open: ")
    assert found["auto"][str(garbage)].endswith("(neither decoder reads it)")


def test_lists_from_a_tree_count_av1_videos_with_auto(
    mixed_dataset: tuple[dict[str, Any], list[str]], tmp_path: Path
) -> None:
    data, av1 = mixed_dataset
    root = tmp_path / "tree"
    (root / "left").mkdir(parents=True)
    for video in [*sorted(Path(data["TRAIN_DATA_PATH"], "train", "left").glob("*.mp4"))[:3], Path(av1[0])]:
        (root / "left" / video.name).write_bytes(video.read_bytes())
    with_decord = write_annotations_from_tree(root, tmp_path / "decord", val_fraction=0.0)
    assert [(Path(path).name, reason.startswith("cannot open: ")) for path, reason in with_decord.skipped] == [
        ("left_000.mkv", True)
    ]
    with_auto = write_annotations_from_tree(root, tmp_path / "auto", val_fraction=0.0, decoder="auto")
    assert with_auto.skipped == []
    assert "left/left_000.mkv 16 0" in with_auto.train.read_text().splitlines()


@pytest.mark.parametrize("name", ["h264", "rgb_lossless"])
def test_resize_after_decoding_matches_the_decoder_transform(videos: dict[str, str], name: str) -> None:
    """What GPU decoding does (torchcodec has no decoder transforms there), checked on the CPU."""
    after = resize_frames(decode("torchcodec", videos[name]), SMALLER)
    during = decode("torchcodec", videos[name], SMALLER)
    assert after.shape == during.shape and after.dtype == torch.uint8
    assert (after.int() - during.int()).abs().float().mean() < 1.0
