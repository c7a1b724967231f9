"""The published Kinetics-400 weights behind ``CONFIG.MODEL.PRETRAINED: True``, and the cache they are fetched into.

``python -m trainer fetch-weights NAME`` downloads the weights of model NAME once into the cache and verifies them;
the trainer itself never downloads: it reads the cache (or ``CONFIG.MODEL.PRETRAINED_PATH``) and fails with one
line saying how to fetch when the file is not there.

Cache layout: ``<cache>/<source>/<file name as published>``, e.g.
``~/.cache/vidcluster/weights/gluoncv/slowfast_8x8_resnet50_kinetics400-e94e9a57.pth``. A mirror is a directory laid
out the same way, served over HTTPS: with ``VIDCLUSTER_WEIGHTS_URL=https://host/dir`` (or ``--base-url``) a file is
fetched from ``https://host/dir/<source>/<file>`` instead of the source's own site. Plain http (which anyone on the way
can read and change) is refused unless asked for: ``--allow-http`` or ``VIDCLUSTER_WEIGHTS_ALLOW_HTTP=1``.

Checksums. A download is checked against what its source publishes (``checksum_kind``):

* ``sha1``: the full SHA-1 that GluonCV publishes for each file (gluoncv 0.10.5, ``torch/model_zoo/model_store.py``).
* ``sha256-prefix``: the leading SHA-256 hex digits that torchvision puts in the file name (torchvision's own check:
  32 bits, which a forger can match). torchvision publishes no full hash of its weights (not in its weight enums'
  meta, not in its docs), so a first fetch is trusted on first use, and says so.
* ``recorded``: PySlowFast and pytorchvideo publish no checksum; nothing to check the download against: trusted on
  first use, and the fetch says so.
* ``sha256``: the full SHA-256, for a site's own table (below).

Then the file's full SHA-256 is recorded next to it (``<file>.sha256``) and printed, and every later use (the
trainer on each node, a later fetch) checks the full SHA-256: the entry's own for ``sha256`` entries, else the record,
and a file without one is refused (fetching it again records it). The launcher ships the record with the file.

Each entry records the clip its weights were trained on (:class:`TrainedClip`: frames, sampling rate, crop size), as
its source publishes it; a run that starts from the weights trains on that clip unless it says otherwise
(``CONFIG.MODEL.ALLOW_OTHER_CLIP``, checked by :mod:`trainer.weights.pretrained`).

A site's own published weights (models fine-tuned in house, a mirror with other files) extend the table: a JSON list
of entries in the file named by ``VIDCLUSTER_WEIGHTS_TABLE``, each ``{"source", "url", "format", "checksum_kind",
"checksum", "mean", "std", "models", "clip": [frames, sampling rate, crop size]}`` as in :class:`ZooEntry`.
launch-training.yml ships that table to the nodes with the weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from trainer.data.transforms import IMAGENET_MEAN, IMAGENET_STD
from trainer.hf_models import HUB_ID
from trainer.runtime import atomic
from trainer.runtime.contract import WEIGHTS_ALLOW_HTTP_ENV as ALLOW_HTTP_ENV
from trainer.runtime.contract import WEIGHTS_CACHE as DEFAULT_CACHE
from trainer.runtime.contract import WEIGHTS_CACHE_ENV as CACHE_ENV
from trainer.runtime.contract import WEIGHTS_TABLE_ENV as TABLE_ENV
from trainer.runtime.contract import WEIGHTS_URL_ENV as URL_ENV
from trainer.weights.formats import WeightsError

RECORD_SUFFIX = ".sha256"
CHECKSUM_KINDS = ("sha1", "sha256-prefix", "recorded", "sha256")
# What a first fetch is checked against where the source publishes no full hash: it is trusted on first use.
FIRST_USE = {"sha256-prefix": "only the first 8 hex digits of its SHA-256 (in the file name, checked)",
             "recorded": "no checksum"}

IMAGENET = (IMAGENET_MEAN, IMAGENET_STD)  # GluonCV
KINETICS = ((0.45, 0.45, 0.45), (0.225, 0.225, 0.225))  # PySlowFast and pytorchvideo


@dataclass(frozen=True)
class TrainedClip:
    """The clip a model's weights were trained on, in the config's terms: CONFIG.DATA.CLIP_LEN frames taken every
    FRAME_RATE-th frame (of a 30 fps Kinetics video), CROP_SIZE px square crops."""

    CLIP_LEN: int
    FRAME_RATE: int
    CROP_SIZE: int


# GluonCV's and PySlowFast's model names say it: SlowFast and I3D take 32 frames at stride 2 (T x tau: a SlowFast 8x8
# Slow pathway sees 8 of them, every 8th), Slow f8s8 8 frames at stride 8; R(2+1)D 16 at stride 2 in 112 px crops.
CLIP_32X2 = TrainedClip(32, 2, 224)
CLIP_8X8 = TrainedClip(8, 8, 224)
CLIP_R2PLUS1D = TrainedClip(16, 2, 112)


@dataclass(frozen=True)
class ZooEntry:
    source: str  # gluoncv, pyslowfast, pytorchvideo or torchvision
    url: str
    format: str  # how the file is written (trainer.weights.formats)
    checksum_kind: str  # sha1, sha256-prefix, recorded or sha256 (see the module doc)
    checksum: str  # hex digits; '' when recorded on first fetch
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    models: tuple[str, ...]  # model names (as in CONFIG.MODEL.NAME, lower case) these weights are for
    clip: TrainedClip

    @property
    def file(self) -> str:
        return self.url.rsplit("/", 1)[-1]


def _gluoncv(name: str, sha1: str, clip: TrainedClip, *also: str) -> ZooEntry:
    url = f"https://apache-mxnet.s3-accelerate.dualstack.amazonaws.com/torch/models/{name}-{sha1[:8]}.pth"
    return ZooEntry("gluoncv", url, "gluoncv", "sha1", sha1, *IMAGENET, (name, *also), clip)


def _pyslowfast(file: str, clip: TrainedClip, *models: str) -> ZooEntry:
    url = f"https://dl.fbaipublicfiles.com/pyslowfast/model_zoo/kinetics400/{file}"
    return ZooEntry("pyslowfast", url, "caffe2", "recorded", "", *KINETICS, models, clip)


def _pytorchvideo(file: str, clip: TrainedClip, *models: str) -> ZooEntry:
    url = f"https://dl.fbaipublicfiles.com/pytorchvideo/model_zoo/kinetics/{file}"
    return ZooEntry("pytorchvideo", url, "pytorchvideo", "recorded", "", *KINETICS, models, clip)


KINETICS_FPS = 30  # torchvision gives its clips' frame rate in frames per second, resampled from Kinetics' 30


def _torchvision_clip(docs: str, crop: int) -> TrainedClip:
    """torchvision's weights documentation says ``frame_rate=15``, ``clip_len=16``: its clips resampled to 15 fps."""
    frames = re.search(r"clip_len=(\d+)", docs)
    fps = re.search(r"frame_rate=([\d.]+)", docs)
    if frames is None or fps is None:
        raise WeightsError(f"torchvision's weights documentation no longer gives clip_len and frame_rate: {docs!r}")
    return TrainedClip(int(frames[1]), round(KINETICS_FPS / float(fps[1])), crop)


def _torchvision_entries() -> Iterator[ZooEntry]:
    """torchvision's Kinetics-400 weights of the torchvision models we register, as torchvision describes them."""
    from torchvision.models import get_model_weights

    from trainer.models.torchvision_zoo import TORCHVISION_VIDEO_MODELS

    for name in TORCHVISION_VIDEO_MODELS:
        weights = get_model_weights(name).KINETICS400_V1
        transform = weights.transforms()
        prefix = weights.url.rsplit("-", 1)[-1].split(".")[0]
        yield ZooEntry("torchvision", weights.url, "torchvision", "sha256-prefix", prefix,
                       tuple(transform.mean), tuple(transform.std), (name, f"torchvision_{name}"),
                       _torchvision_clip(weights.meta["_docs"], transform.crop_size[0]))


# GluonCV names and SHA-1s from gluoncv 0.10.5; '_custom' models start from the same Kinetics weights (GluonCV drops
# their classifier, as our loader re-initialises a classifier of another size).
ZOO: tuple[ZooEntry, ...] = (
    _gluoncv("slowfast_4x16_resnet50_kinetics400", "1d1eadb258ccfc0c117db0ff0eaf1638d18405b3", CLIP_32X2,
             "slowfast_4x16_resnet50", "slowfast_4x16_resnet50_custom"),
    _gluoncv("slowfast_8x8_resnet50_kinetics400", "e94e9a57eaa2f4dde12673bc6632f9aa090d8c21", CLIP_32X2,
             "slowfast_8x8_resnet50"),
    _gluoncv("i3d_resnet50_v1_kinetics400", "185454973645ff66b6310e715863384db135d87f", CLIP_32X2,
             "i3d_resnet50", "i3d_resnet50_v1_custom"),
    _gluoncv("i3d_slow_resnet50_f8s8_kinetics400", "1c3d98a1831ee477def36d6085635c2860db0b77", CLIP_8X8),
    _gluoncv("i3d_slow_resnet50_f16s4_kinetics400", "a3e419f1b9cde3b57b9b19a9bd93281bb819a871",
             TrainedClip(16, 4, 224)),
    _gluoncv("i3d_slow_resnet50_f32s2_kinetics400", "078c817bf18d702891de553de61c9115e27c4afd", CLIP_32X2,
             "i3d_slow_resnet50_f32s2_custom"),
    _gluoncv("r2plus1d_v1_resnet18_kinetics400", "340a59522b4ffe7e3621ad4a269e4cd4a99f74b2", CLIP_R2PLUS1D,
             "r2plus1d_resnet18"),
    _gluoncv("r2plus1d_v1_resnet34_kinetics400", "5102fd1736a2a205f5fd7bded5d2e0d2e5ca6307", CLIP_R2PLUS1D,
             "r2plus1d_resnet34"),
    _gluoncv("r2plus1d_v1_resnet50_kinetics400", "9a3b665c182f81f22d4a105c75fac030ad20a628", CLIP_R2PLUS1D,
             "r2plus1d_resnet50", "r2plus1d_v1_resnet50_custom"),
    _pyslowfast("SLOWFAST_4x16_R50.pkl", CLIP_32X2, "slowfast_4x16_r50"),
    _pyslowfast("SLOWFAST_8x8_R50.pkl", CLIP_32X2, "slowfast_8x8_r50"),
    _pyslowfast("SLOWONLY_8x8_R50.pkl", CLIP_8X8, "slow_8x8_r50"),
    _pyslowfast("I3D_8x8_R50.pkl", CLIP_8X8, "i3d_8x8_r50"),
    _pytorchvideo("SLOWFAST_8x8_R50.pyth", CLIP_32X2, "slowfast_r50"),
    _pytorchvideo("SLOW_8x8_R50.pyth", CLIP_8X8, "slow_r50"),
    _pytorchvideo("I3D_8x8_R50.pyth", CLIP_8X8, "i3d_r50"),
    *_torchvision_entries(),
)


def site_entries() -> tuple[ZooEntry, ...]:
    """The entries of the site's own table ($VIDCLUSTER_WEIGHTS_TABLE), if one is named."""
    path = os.environ.get(TABLE_ENV)
    if not path:
        return ()
    try:
        rows = json.loads(Path(path).expanduser().read_text())
        table = tuple(ZooEntry(str(r["source"]), str(r["url"]), str(r["format"]), str(r["checksum_kind"]),
                               str(r.get("checksum", "")), tuple(r["mean"]), tuple(r["std"]),
                               tuple(str(m).lower() for m in r["models"]), TrainedClip(*map(int, r["clip"])))
                      for r in rows)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WeightsError(f"${TABLE_ENV} {path}: not a table of weights ({type(exc).__name__}: {exc})") from None
    for entry in table:
        if entry.checksum_kind not in CHECKSUM_KINDS:
            raise WeightsError(f"${TABLE_ENV} {path}: {entry.file}: checksum_kind {entry.checksum_kind!r}, not one of "
                               f"{', '.join(CHECKSUM_KINDS)}")
        if entry.checksum_kind == "sha256" and not re.fullmatch(r"[0-9a-f]{64}", entry.checksum):
            raise WeightsError(f"${TABLE_ENV} {path}: {entry.file}: a sha256 checksum is 64 lower-case hex digits")
    return table


def entries() -> tuple[ZooEntry, ...]:
    """The site's own entries first (they may stand in for a published one), then the published ones."""
    return (*site_entries(), *ZOO)


def models_with_weights() -> list[str]:
    return sorted(name for entry in entries() for name in entry.models)


def entry_for(model_name: str) -> ZooEntry:
    """The published weights of ``model_name``; WeightsError (naming the model) if there are none."""
    key = model_name.lower()
    for entry in entries():
        if key in entry.models:
            return entry
    raise WeightsError(
        f"model {model_name!r} has no published Kinetics weights for CONFIG.MODEL.PRETRAINED: True "
        "('python -m trainer fetch-weights --list' names the models that have); set PRETRAINED: False, or LOAD: "
        "True with a PRETRAINED_PATH"
    )


def cache_dir(cache: str | Path | None = None) -> Path:
    """``cache``, else $VIDCLUSTER_WEIGHTS_CACHE, else ~/.cache/vidcluster/weights."""
    return Path(cache or os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def cached_path(entry: ZooEntry, cache: str | Path | None = None) -> Path:
    return cache_dir(cache) / entry.source / entry.file


def source_url(entry: ZooEntry, base_url: str | None = None, allow_http: bool = False) -> str:
    """Where to download ``entry`` from: the mirror's copy (``base_url``, else $VIDCLUSTER_WEIGHTS_URL) or the
    source's; WeightsError for an http URL unless ``allow_http`` (or $VIDCLUSTER_WEIGHTS_ALLOW_HTTP=1)."""
    base = base_url or os.environ.get(URL_ENV)
    url = f"{base.rstrip('/')}/{entry.source}/{entry.file}" if base else entry.url
    scheme = url.split(":", 1)[0].lower()
    if scheme == "https" or (scheme == "http" and (allow_http or os.environ.get(ALLOW_HTTP_ENV) == "1")):
        return url
    if scheme == "http":
        raise WeightsError(
            f"{url}: plain http, which anyone on the way can read and change; use an https mirror, or ask for this "
            f"one explicitly with --allow-http (or {ALLOW_HTTP_ENV}=1)"
        )
    raise WeightsError(f"{url}: not an http(s) URL")


def _digests(path: Path) -> tuple[str, str]:
    sha1, sha256 = hashlib.sha1(), hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            sha1.update(chunk)
            sha256.update(chunk)
    return sha1.hexdigest(), sha256.hexdigest()


def record_path(path: Path) -> Path:
    """Where a fetched file's full SHA-256 is recorded."""
    return path.with_name(path.name + RECORD_SUFFIX)


def _mismatch(path: Path, entry: ZooEntry, model_name: str, what: str, actual: str, expected: str) -> WeightsError:
    return WeightsError(f"{path}: checksum mismatch for the {entry.source} weights of {model_name} ({what} {actual}, "
                        f"expected {expected}); delete it and fetch again")


def check_published(entry: ZooEntry, path: Path, model_name: str) -> str:
    """Check ``path`` against what the entry's source publishes (nothing for ``recorded``); returns its SHA-256."""
    sha1, sha256 = _digests(path)
    actual = {"sha1": sha1, "sha256": sha256, "sha256-prefix": sha256[: len(entry.checksum)]}.get(entry.checksum_kind)
    if actual is not None and actual != entry.checksum:
        raise _mismatch(path, entry, model_name, entry.checksum_kind, actual, entry.checksum)
    return sha256


def verify(entry: ZooEntry, path: Path, model_name: str) -> str:
    """Check ``path`` against the published checksum and its full SHA-256 (the entry's, else the record written when
    it was fetched); returns the SHA-256. A file without a full SHA-256 to check is refused."""
    record = record_path(path)
    if entry.checksum_kind == "sha256":
        expected = entry.checksum
    elif record.is_file():
        expected = next(iter(record.read_text().split()), "")
    else:
        raise WeightsError(
            f"{path}: no record of its SHA-256 ({record.name}): it was not fetched here, or its record was lost; "
            f"delete it and fetch it again with 'python -m trainer fetch-weights {model_name}'"
        )
    sha256 = check_published(entry, path, model_name)
    if sha256 != expected:
        raise _mismatch(path, entry, model_name, "sha256", sha256, expected or "(an empty record)")
    return sha256


def fetch(model_name: str, cache: str | Path | None = None, base_url: str | None = None,
          allow_http: bool = False) -> Path:
    """Download the weights of ``model_name`` into the cache unless they are there; verify; record the full SHA-256;
    return the path. A cached file whose source publishes a checksum and that has no record yet (fetched by an
    older version) is checked against the published checksum and recorded."""
    entry = entry_for(model_name)
    dest = cached_path(entry, cache)
    if dest.is_file():
        if entry.checksum_kind in ("sha1", "sha256-prefix") and not record_path(dest).is_file():
            _write_record(dest, check_published(entry, dest, model_name), entry)
        verify(entry, dest, model_name)
        return dest
    url = source_url(entry, base_url, allow_http)
    if entry.checksum_kind in FIRST_USE:
        print(f"{entry.source} publishes {FIRST_USE[entry.checksum_kind]} of {entry.file}: trusted on first use (its "
              "full SHA-256 is recorded now and checked on every later use)", file=sys.stderr)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with atomic.replacing(dest) as tmp:
            with tmp.open("wb") as out, urllib.request.urlopen(url, timeout=60) as response:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
            _write_record(dest, check_published(entry, tmp, model_name), entry)
    except (urllib.error.URLError, OSError) as exc:
        raise WeightsError(f"cannot download the weights of {model_name} from {url}: {exc}") from None
    return dest


def _write_record(path: Path, sha256: str, entry: ZooEntry) -> None:
    record_path(path).write_text(f"{sha256}  {entry.file}\n")


def main(argv: list[str]) -> int:
    """``python -m trainer fetch-weights NAME [--cache DIR] [--base-url URL]``: prints the cached file's path."""
    parser = argparse.ArgumentParser(prog="python -m trainer fetch-weights",
                                     description="download a model's published Kinetics weights into the cache")
    parser.add_argument("name", nargs="?", help="model name as in CONFIG.MODEL.NAME, or a Hugging Face hub id "
                        "(OWNER/NAME, as in CONFIG.MODEL.PRETRAINED_PATH): its snapshot in the Hugging Face cache")
    parser.add_argument("--model", help="with a hub id: the CONFIG.MODEL.NAME it is for; a checkpoint of another "
                        "family or size is refused")
    parser.add_argument("--cache", help=f"cache directory (default ${CACHE_ENV} or {DEFAULT_CACHE})")
    parser.add_argument("--base-url", help=f"mirror laid out like the cache (default ${URL_ENV} or the source)")
    parser.add_argument("--allow-http", action="store_true",
                        help=f"fetch from a plain http URL (default: refused unless ${ALLOW_HTTP_ENV}=1)")
    parser.add_argument("--list", action="store_true", help="list the models with published weights")
    args = parser.parse_args(argv)
    if args.list:
        for entry in entries():
            clip = entry.clip
            print(f"{', '.join(entry.models)}: {entry.source} {entry.url} ({entry.checksum_kind}; trained on "
                  f"{clip.CLIP_LEN} frames at stride {clip.FRAME_RATE}, {clip.CROP_SIZE} px)")
        return 0
    if not args.name:
        parser.error("NAME is required (or --list)")
    if HUB_ID.fullmatch(args.name):
        return _fetch_hub(args)
    if args.model:
        parser.error("--model: only with a Hugging Face hub id (the zoo's weights are named by their model)")
    try:
        path = fetch(args.name, args.cache, args.base_url, args.allow_http)
    except WeightsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    recorded = record_path(path).read_text().split()[0]
    print(f"sha256 {recorded}, recorded in {record_path(path).name} and checked on every use", file=sys.stderr)
    print(path)
    return 0


def _fetch_hub(args: argparse.Namespace) -> int:
    """fetch-weights OWNER/NAME: the hub id's snapshot in the Hugging Face cache (where huggingface_hub's own
    variables say), checked against --model; prints the snapshot folder."""
    from trainer.weights import hf_checkpoint

    for option in ("cache", "base_url", "allow_http"):
        if getattr(args, option):
            print(f"error: --{option.replace('_', '-')}: a hub id is fetched into the Hugging Face cache from the hub "
                  "or its mirror ($HF_HOME / $HF_HUB_CACHE, $HF_ENDPOINT), not the zoo's", file=sys.stderr)
            return 2
    try:
        folder = hf_checkpoint.fetch_hub(args.name)
        if args.model:
            hf_checkpoint.check_hub_model(folder, args.name, args.model)
    except WeightsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(folder)
    return 0
