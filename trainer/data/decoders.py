"""Video decoders behind one interface: decord (the default, what GluonCV users know) and torchcodec (maintained,
reads AV1, decodes on NVIDIA GPUs).

    decoder = ClipDecoder("auto", size=(340, 256))        # CONFIG.DATA.DECODER, NEW_WIDTH x NEW_HEIGHT
    clip = decoder.clip(path, lambda num_frames: indices)  # clip.frames: uint8 [len(indices), H, W, 3]

`auto` decodes with decord and opens a video decord cannot open (AV1, for one) with torchcodec; `clip.fallback`
then says why decord could not, so the caller reports the video once instead of calling it bad.

Parity. Both backends give the same frame for the same index: torchcodec seeks in exact mode (it scans the file
once when opening it, so frame i is the i-th frame in presentation order, as in decord). At the native size the
frames are bit-identical for every codec decord reads (H.264, HEVC, VP9, lossless or not): the codecs decode
bit-exactly and both convert YUV to RGB with FFmpeg's swscale. One exception, decord's: it seeks into HEVC with open
GOPs (x265's default) inexactly and returns neighbouring frames; torchcodec gives the right ones.

With a decode size (NEW_WIDTH x NEW_HEIGHT, when KEEP_ASPECT_RATIO is False) both resize in the decoder with
swscale's bilinear filter to the same geometry, but in a different order: decord scales the YUV planes and then
converts, torchcodec converts and then scales the RGB frame (its `Resize` decoder transform; on a GPU, where
torchcodec has no decoder transforms, torchvision's bilinear resize after decoding). The frames are identical for
4:4:4 and RGB videos; for 4:2:0 ones (almost every H.264 file) the chroma is interpolated differently and pixels
differ by a few levels at colour edges (about 3 on average on the tests' per-pixel noise, the worst case).

The readers are opened where the clip is decoded, i.e. inside the DataLoader worker; nothing here is shared
between processes. Errors a video causes become `BadVideo` with a one-line reason.

Time limit (CONFIG.DATA.DECODE_TIME_LIMIT): the readers then live in the decoding process's helper
(trainer.data.timelimit; for GPU decoding a spawned one, as CUDA does not survive a fork), and a clip that is not
decoded in time, or whose decoder crashes, is a bad video (`DecodeTimeout`: "decoding took longer than N s") instead
of a hung or dead worker.

Only videos are opened: a text file is refused unread (`check_file`). decord and torchcodec take no list of allowed
demuxers or protocols (ffmpeg's -format_whitelist, -protocol_whitelist), and the demuxers that read other files or
the network for one input (an HLS or DASH playlist, a concat list, an SDP description) all read a text file: a live
playlist would make the decoder wait for ever, and a playlist named like a clip would pull another file (any
``file://`` address, a private one) into the dataset.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import stat
from collections.abc import Callable
from typing import Literal, NamedTuple, Protocol

import decord
import numpy as np
import torch

from trainer.data.timelimit import Deadline, State, TimeLimit, TimeLimitExceeded
from trainer.errors import UserError, first_line
from trainer.hardware import decoder_device_problem

Backend = Literal["decord", "torchcodec"]
DecoderChoice = Literal["decord", "torchcodec", "auto"]
NATIVE: tuple[int, int] = (-1, -1)  # (width, height) that keeps the video's own size
SNIFF_BYTES = 4096  # how much of a file tells a video (binary) from a playlist or description (text)
# Bytes no text has (whitespace aside); every video container's first bytes have some (mp4 box sizes, EBML, RIFF).
BINARY_BYTES = bytes([*range(0, 9), *range(14, 32), 127])

log = logging.getLogger("trainer")

# We name bad videos ourselves; without this, FFmpeg prints a block of errors for each one.
decord.logging.set_level(decord.logging.QUIET)


class BadVideo(Exception):
    """A video that cannot give a clip; the message is the reason reported to the user."""


class DecodeTimeout(BadVideo):
    """A video whose clip was not decoded within the time limit: it would hang again, so it is not tried again."""


class DecoderUnavailable(UserError):
    """The chosen decoder cannot run on this machine (not installed, or no FFmpeg libraries for torchcodec)."""


# "[04:32:17] /github/workspace/src/video/video_reader.cc:151: " (decord) and
# "SingleStreamDecoder, /__w/torchcodec/.../SingleStreamDecoder.cpp:41, " (torchcodec): where in their C++ it failed.
_SOURCE_PREFIX = re.compile(r"^(\[[\d:]+\] \S+:\d+: |\w+, \S+:\d+, )")


def decoder_error(exc: BaseException) -> str:
    """The decoders' errors carry C++ traces and source locations; the first line, without them, says what failed."""
    return _SOURCE_PREFIX.sub("", first_line(exc))


class VideoReader(Protocol):
    """An open video of one backend: its length and the frames at sorted unique indices."""

    backend: Backend

    def __len__(self) -> int: ...

    def get_frames(self, indices: list[int]) -> torch.Tensor:
        """uint8 [len(indices), H, W, 3] for sorted, unique indices."""
        ...


class DecordReader:
    backend: Backend = "decord"

    def __init__(self, path: str, size: tuple[int, int], device: str = "cpu") -> None:
        width, height = size
        # One decoder thread: DataLoader workers already decode in parallel.
        self._reader = decord.VideoReader(path, ctx=decord.cpu(0), width=width, height=height, num_threads=1)

    def __len__(self) -> int:
        return len(self._reader)

    def get_frames(self, indices: list[int]) -> torch.Tensor:
        # Zero-copy through DLPack (asnumpy() would copy the whole clip); decord can hand back RGBA for some small
        # frames.
        return torch.from_dlpack(self._reader.get_batch(indices).to_dlpack())[..., :3]


def resize_frames(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """uint8 [T, H, W, 3] resized to size = (width, height), bilinear with antialiasing: torchcodec's Resize decoder
    transform, done by torchvision where torchcodec has no decoder transforms (GPU decoding)."""
    from torchvision.transforms.v2 import functional as TF

    width, height = size
    return TF.resize(frames.permute(0, 3, 1, 2), [height, width], antialias=True).permute(0, 2, 3, 1)


class TorchcodecReader:
    backend: Backend = "torchcodec"

    def __init__(
        self, path: str, size: tuple[int, int], device: str = "cpu", seek_mode: str = "exact"
    ) -> None:
        from torchcodec.decoders import VideoDecoder
        from torchcodec.transforms import Resize

        width, height = size
        self.device = device
        # torchcodec applies decoder transforms on the CPU only; GPU-decoded frames are resized on the GPU.
        in_decoder = size != NATIVE and device == "cpu"
        self._resize_after = size if size != NATIVE and not in_decoder else None
        self._decoder = VideoDecoder(
            path,
            dimension_order="NHWC",
            num_ffmpeg_threads=1,
            device=device,
            # exact: frame i is the i-th frame, as in decord; approximate trusts the container's index (benchmarks).
            seek_mode=seek_mode,  # type: ignore[arg-type]
            transforms=[Resize((height, width))] if in_decoder else None,
        )

    def __len__(self) -> int:
        return len(self._decoder)

    def get_frames(self, indices: list[int]) -> torch.Tensor:
        frames = self._decoder.get_frames_at(indices).data
        if self.device != "cpu" and self._decoder.cpu_fallback:
            _warn_once(f"torchcodec decodes on the CPU instead of {self.device}: {self._decoder.cpu_fallback}")
        frames = frames.to(self.device)  # a CPU fallback inside torchcodec must not mix devices in a batch
        return frames if self._resize_after is None else resize_frames(frames, self._resize_after)


READERS: dict[Backend, Callable[[str, tuple[int, int], str], VideoReader]] = {
    "decord": DecordReader,
    "torchcodec": TorchcodecReader,
}


class HelperReader:
    """A reader of one backend that lives in the decoding process's helper (trainer.data.timelimit): opening it and
    reading frames are calls that must end before the clip's deadline."""

    def __init__(self, backend: Backend, path: str, size: tuple[int, int], device: str, within: Deadline) -> None:
        self.backend = backend
        self.device = device
        self._within = within
        self._length: int = within.call(_open_in_helper, backend, path, size, device)

    def __len__(self) -> int:
        return self._length

    def get_frames(self, indices: list[int]) -> torch.Tensor:
        frames = self._within.call(_read_in_helper, indices)  # on the CPU: it came through shared memory
        return frames if self.device == "cpu" else frames.to(self.device)


def _open_in_helper(state: State, backend: Backend, path: str, size: tuple[int, int], device: str) -> int:
    state["reader"] = reader = READERS[backend](path, size, device)
    return len(reader)


def _read_in_helper(state: State, indices: list[int]) -> torch.Tensor:
    return state["reader"].get_frames(indices).cpu()


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


def torchcodec_problem() -> str | None:
    """Why torchcodec cannot decode videos on this machine, or None when it can."""
    try:
        import torchcodec
    except Exception as exc:  # not installed, or built for another torch
        return f"torchcodec does not import ({decoder_error(exc)})"
    if torchcodec.ffmpeg_major_version is None:
        return (
            f"torchcodec {torchcodec.__version__} finds no FFmpeg shared libraries it supports "
            "(install them: Debian's and Ubuntu's ffmpeg package)"
        )
    return None


@functools.cache
def decode_device(requested: str, gpu: int = 0) -> str:
    """Where torchcodec decodes: 'cuda:<gpu>' when a GPU and a CUDA-enabled torchcodec exist; 'cpu' and a warning
    saying why (once per process) when no GPU is visible; DecoderUnavailable naming the build to install when
    torchcodec is a CPU-only build (it would decode in the training process, which has no workers then)."""
    if requested == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        log.warning("CONFIG.DATA.DECODER_DEVICE is cuda but no GPU is visible: torchcodec decodes on the CPU")
        return "cpu"
    import torchcodec

    problem = decoder_device_problem(requested, torchcodec.__version__, torch.version.cuda)
    if problem is not None:
        raise DecoderUnavailable(problem)
    return f"cuda:{gpu}"


def check_file(path: str) -> None:
    """BadVideo for what no decoder can read or may read: a missing, unreadable, non-regular or empty file, or a
    text file (a playlist or a stream description: what it names is not read)."""
    try:  # one stat: the file may vanish between two looks (an unmounted share)
        info = os.stat(path)
    except FileNotFoundError as exc:
        raise BadVideo("missing file") from exc
    except OSError as exc:
        raise BadVideo(f"cannot read: {exc.strerror}") from exc
    if not stat.S_ISREG(info.st_mode):
        raise BadVideo("not a regular file")
    if info.st_size == 0:
        raise BadVideo("empty file (0 bytes)")
    try:
        with open(path, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError as exc:
        raise BadVideo(f"cannot read: {exc.strerror}") from exc
    if head.translate(None, BINARY_BYTES) == head:  # no byte of a binary file
        kind = "an HLS playlist" if head.startswith(b"#EXTM3U") else "a text file"
        raise BadVideo(f"{kind}, not a video: refused unread (a playlist or stream description would make the "
                       "decoder read the files or streams it names)")


def open_reader(
    backend: Backend, path: str, size: tuple[int, int] = NATIVE, device: str = "cpu", within: Deadline | None = None
) -> VideoReader:
    """Open a video with one backend (in this process, or in its helper by the deadline ``within``); BadVideo says
    why not."""
    check_file(path)
    try:
        reader = READERS[backend](path, size, device) if within is None else HelperReader(
            backend, path, size, device, within)
    except TimeLimitExceeded as exc:
        raise DecodeTimeout(str(exc)) from exc
    except Exception as exc:  # decord raises RuntimeError or DECORDError (not a RuntimeError), torchcodec ValueError
        raise BadVideo(f"cannot open: {decoder_error(exc)}") from exc
    if len(reader) == 0:
        raise BadVideo("no video frames")
    return reader


def read_frames(reader: VideoReader, indices: np.ndarray) -> torch.Tensor:
    """Frames uint8 [len(indices), H, W, 3] in the order of `indices` (repeats allowed), from one batched read."""
    unique, inverse = np.unique(indices, return_inverse=True)
    try:
        frames = reader.get_frames(unique.tolist())
    except TimeLimitExceeded as exc:
        raise DecodeTimeout(str(exc)) from exc
    except Exception as exc:  # a truncated file can open and then fail on the missing frames
        raise BadVideo(f"cannot decode frames: {decoder_error(exc)}") from exc
    if len(unique) == len(indices) and (unique == indices).all():
        return frames  # already in order (a clip inside a video): no copy
    return frames[torch.from_numpy(inverse.reshape(-1)).to(frames.device)]


class Clip(NamedTuple):
    frames: torch.Tensor  # uint8 [T, H, W, 3]
    fallback: str | None  # auto only: why decord could not open the video that torchcodec decoded


class ClipDecoder:
    """Decodes clips with CONFIG.DATA.DECODER at a decode size; cheap to pickle into DataLoader workers.

    `device` is CONFIG.DATA.DECODER_DEVICE ('cpu' or 'cuda', torchcodec only) and `gpu` the process's GPU index.
    `time_limit` (CONFIG.DATA.DECODE_TIME_LIMIT, seconds; 0: none): each clip is decoded in this process's helper
    by that deadline (trainer.data.timelimit): a forked one on the CPU, a spawned one on a GPU (a forked child cannot
    use CUDA; the frames come back through the CPU).
    """

    def __init__(
        self, choice: DecoderChoice = "decord", size: tuple[int, int] = NATIVE, device: str = "cpu", gpu: int = 0,
        time_limit: float = 0.0,
    ) -> None:
        if choice != "decord":
            problem = torchcodec_problem()
            if problem is not None:
                raise DecoderUnavailable(f"decoder {choice} needs torchcodec: {problem}")
        self.choice = choice
        self.size = size
        self.device = decode_device(device, gpu) if choice == "torchcodec" else "cpu"
        # auto: videos decord could not open in this process, and why; they go straight to torchcodec next time.
        self._decord_cannot_open: dict[str, str] = {}
        self._fitted: dict[str, tuple[int, int]] = {}  # clip(short_side=...): each video's decode size
        spawn = None if self.device == "cpu" else __name__  # the helper imports this module's readers
        self.time_limit = TimeLimit(time_limit, spawn) if time_limit > 0 else None

    def open(
        self, path: str, size: tuple[int, int] | None = None, within: Deadline | None = None
    ) -> tuple[VideoReader, str | None]:
        """The reader of a video (in the helper, by ``within``), and (auto only) why decord could not open it when
        torchcodec did. A video that ran out of time is not given to the other decoder: it is bad."""
        size = self.size if size is None else size
        if self.choice != "auto":
            return open_reader(self.choice, path, size, self.device, within), None
        check_file(path)
        reason = self._decord_cannot_open.get(path)
        if reason is None:
            try:
                return open_reader("decord", path, size, within=within), None
            except DecodeTimeout:
                raise
            except BadVideo as exc:
                reason = self._decord_cannot_open[path] = str(exc)
        try:
            return open_reader("torchcodec", path, size, within=within), reason
        except DecodeTimeout:
            raise
        except BadVideo as exc:
            raise BadVideo(f"decord: {reason}; torchcodec: {exc}") from exc

    def clip(self, path: str, sample: Callable[[int], np.ndarray], short_side: int | None = None) -> Clip:
        """Frames at the indices `sample(num_frames)` picks, at the decode size.

        ``short_side`` (native decode size only): the largest short side the caller will resize frames to. A video
        larger than that is decoded at that short side (aspect kept) instead, so no frame is converted and shrunk at
        a size nobody needs. Which size a video decodes at is decided once, from its frames' size, and remembered
        by path: the first clip of a larger video is decoded a second time at the smaller size, so every clip of it,
        in any worker and any epoch, is decoded the same way."""
        size = self._fitted.get(path, self.size) if short_side is not None and self.size == NATIVE else self.size
        within = self.time_limit.start() if self.time_limit is not None else None  # one deadline for the clip
        clip, indices = self._decode(path, sample, size, within)
        if short_side is None or self.size != NATIVE or path in self._fitted:
            return clip
        height, width = clip.frames.shape[1:3]
        self._fitted[path] = fitted = fit_short_side((width, height), short_side)
        # the same frames again (``sample`` may draw random numbers: it is called once per clip)
        return clip if fitted == NATIVE else self._decode(path, lambda _: indices, fitted, within)[0]

    def _decode(
        self, path: str, sample: Callable[[int], np.ndarray], size: tuple[int, int], within: Deadline | None
    ) -> tuple[Clip, np.ndarray]:
        reader, fallback = self.open(path, size, within)
        indices = sample(len(reader))
        try:
            return Clip(read_frames(reader, indices), fallback), indices
        except DecodeTimeout:
            raise
        except BadVideo:
            if reader.backend != "decord" or size == NATIVE:
                raise
        # decord mis-sizes some resized outputs (dmlc/decord#336, e.g. width 48); the native size always works
        # and the transforms resize anyway, so retry before calling the video bad.
        return Clip(read_frames(open_reader("decord", path, within=within), indices), fallback), indices


def fit_short_side(size: tuple[int, int], short_side: int) -> tuple[int, int]:
    """(width, height) with the short side at ``short_side`` and the aspect kept (even, as the decoders' scalers
    like it), or NATIVE when ``size`` is not larger than that."""
    width, height = size
    if min(width, height) <= short_side:
        return NATIVE
    scale = short_side / min(width, height)
    return (max(2, round(width * scale / 2) * 2), max(2, round(height * scale / 2) * 2))
