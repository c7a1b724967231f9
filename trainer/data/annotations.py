"""Annotation lists: GluonCV (`path num_frames label`) and PySlowFast (`path label`), space or comma
separated.

Paths are relative to a data root (absolute paths are used as they are) and may hold spaces (Kinetics class
folders such as `air drumming/`): a line is read from the right, the label last, then the frame count if the
token before the label is an integer. Blank lines and `#` comments are skipped.
`write_annotations_from_tree` builds train/val lists and a class index from a `root/<class_name>/<video>` tree;
`read_kinetics_csv` reads Kinetics' annotation CSVs (trainer.data.prepare makes a dataset of them).
"""

from __future__ import annotations

import csv
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.errors import UserError

if TYPE_CHECKING:
    from trainer.data.decoders import ClipDecoder

VIDEO_EXTENSIONS = frozenset({".mp4", ".avi", ".mkv", ".webm", ".mov", ".m4v", ".mpg", ".mpeg"})


class AnnotationError(UserError, ValueError):
    """A malformed annotation or class-index file; the message names the file and line."""


@dataclass(frozen=True)
class VideoRecord:
    """One annotated video: resolved path, integer label, frame count when the list gives one."""

    path: str
    label: int
    num_frames: int | None = None


@dataclass(frozen=True)
class TreeAnnotations:
    """What `write_annotations_from_tree` wrote, plus the videos it left out (unreadable) and why."""

    train: Path
    val: Path
    class_index: Path
    classes: list[str]
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _split_fields(line: str) -> list[str]:
    """[path, label] or [path, num_frames, label]; the path keeps its inner spaces."""
    # A comma anywhere means a CSV-style line (PySlowFast allows both); otherwise whitespace separates.
    if "," in line:
        return [part.strip() for part in line.split(",")]
    tokens = line.rsplit(maxsplit=2)
    if len(tokens) == 3 and not tokens[1].lstrip("-").isdigit():
        # `some path.mp4 LABEL`: the middle token belongs to the path.
        tokens = line.rsplit(maxsplit=1)
    return tokens


def _parse_number(text: str, what: str, where: str, kind: type[int] | type[float] = int) -> Any:
    try:
        value = kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise AnnotationError(f"{where}: {what} must be {noun}, got {text!r}") from None
    if value < 0:
        raise AnnotationError(f"{where}: {what} must be >= 0, got {text}")
    return value


def parse_annotation_line(line: str, data_root: str | Path, where: str) -> VideoRecord:
    """Parse one non-blank line; `where` ("file:line") prefixes every error message."""
    fields = _split_fields(line)
    if len(fields) not in (2, 3) or not fields[0]:
        raise AnnotationError(
            f"{where}: expected 'path label' or 'path num_frames label' (space or comma separated), "
            f"got {line!r}"
        )
    num_frames = _parse_number(fields[1], "num_frames", where) if len(fields) == 3 else None
    label = _parse_number(fields[-1], "label", where)
    return VideoRecord(path=str(Path(data_root) / fields[0]), label=label, num_frames=num_frames)


def read_annotations(
    anno_path: str | Path, data_root: str | Path, num_classes: int | None = None
) -> list[VideoRecord]:
    """Read a GluonCV or PySlowFast list; with `num_classes`, labels outside [0, num_classes) are errors."""
    anno_path = Path(anno_path)
    if not anno_path.is_file():
        raise AnnotationError(f"{anno_path}: annotation file not found")
    records = []
    for lineno, raw in enumerate(anno_path.read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{anno_path}:{lineno}"
        record = parse_annotation_line(line, data_root, where)
        if num_classes is not None and record.label >= num_classes:
            raise AnnotationError(f"{where}: label {record.label} out of range for NUM_CLASSES={num_classes}")
        records.append(record)
    if not records:
        raise AnnotationError(f"{anno_path}: no videos listed")
    return records


@dataclass(frozen=True)
class KineticsClip:
    """One row of a Kinetics-style annotation CSV."""

    split: str
    label: str
    youtube_id: str
    start: float  # seconds into the YouTube video
    end: float
    where: str  # file:line

    @property
    def name(self) -> str:
        """The clip's file name without extension, as the Kinetics downloaders (ActivityNet's, MMAction2's) write
        it: <youtube_id>_<start:06d>_<end:06d>."""
        return f"{self.youtube_id}_{int(self.start):06d}_{int(self.end):06d}"


KINETICS_COLUMNS = ("label", "youtube_id", "time_start", "time_end", "split")


def _folder_name(text: str, what: str, where: str) -> str:
    """``text``, a path part of the lists' lines (split/label/youtube_id_start_end.mp4); AnnotationError naming the
    field when the lists could not hold it."""
    if not text or text.startswith(".") or "/" in text:
        raise AnnotationError(f"{where}: {what} {text!r} cannot name a folder (empty, starts with '.', or has '/')")
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        # a newline would end a list's line inside the path (a forged entry), and a class index line
        raise AnnotationError(f"{where}: {what} {text!r} holds a control character")
    if "," in text:
        raise AnnotationError(f"{where}: {what} {text!r} holds a comma (a list line with a comma is read as "
                              "comma-separated fields)")
    if text.startswith("#"):
        raise AnnotationError(f"{where}: {what} {text!r} starts with '#' (a list line starting so is a comment)")
    return text


def read_kinetics_csv(path: str | Path) -> Iterator[KineticsClip]:
    """The clips of a Kinetics-style CSV: a header naming at least label, youtube_id, time_start, time_end and split
    (Kinetics' own files also have is_cc, ignored); the label, id and split each name a folder. Bad input names the
    file and line."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = csv.DictReader(f)
            missing = [column for column in KINETICS_COLUMNS if column not in (rows.fieldnames or [])]
            if missing:
                raise AnnotationError(f"{path}: no column {', '.join(missing)} (a Kinetics-style CSV's header is "
                                      f"{','.join(KINETICS_COLUMNS)})")
            for row in rows:
                where = f"{path}:{rows.line_num}"
                if any(row.get(column) is None for column in KINETICS_COLUMNS):
                    raise AnnotationError(f"{where}: {len(rows.fieldnames or [])} fields expected, fewer found")
                start = _parse_number(row["time_start"], "time_start", where, float)
                end = _parse_number(row["time_end"], "time_end", where, float)
                if end <= start:
                    raise AnnotationError(f"{where}: time_end {row['time_end']} is not after time_start "
                                          f"{row['time_start']}")
                yield KineticsClip(*(_folder_name(row[c].strip(), c, where) for c in ("split", "label", "youtube_id")),
                                   start, end, where)
    except OSError as exc:
        raise AnnotationError(f"{path}: cannot read it ({exc.strerror})") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise AnnotationError(f"{path}: not a CSV file ({exc})") from None


def read_class_index(path: str | Path) -> list[str]:
    """Class names in label order: one name per line, or UCF101-style `index name` lines (0- or 1-based).

    A file is read as indexed only when every line starts with an integer, so names with spaces (Kinetics)
    work in the plain form.
    """
    lines = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
    split = [line.split(maxsplit=1) for line in lines]
    if split and all(len(parts) == 2 and parts[0].isdigit() for parts in split):
        return [name for _, name in sorted((int(index), name) for index, name in split)]
    return lines


def annotation_line(path: str, num_frames: int, label: int) -> str:
    """One line of a GluonCV list, as parse_annotation_line reads it back (the path may hold spaces)."""
    return f"{path} {num_frames} {label}\n"


def write_class_index(path: str | Path, classes: list[str]) -> None:
    """One class name per line; the line number (from 0) is the label used in the annotation lists."""
    Path(path).write_text("".join(f"{name}\n" for name in classes))


def count_frames(path: str | Path, decoder: ClipDecoder) -> int:
    """Number of frames of a video as `decoder` reads it (by its time limit, when it has one); BadVideo if it cannot
    open it."""
    within = decoder.time_limit.start() if decoder.time_limit is not None else None
    reader, _ = decoder.open(str(path), within=within)
    return len(reader)


def _list_tree(root: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise AnnotationError(f"{root}: no class folders (expected {root}/<class_name>/<video>)")
    videos = [
        (video, label)
        for label, name in enumerate(classes)
        for video in sorted((root / name).iterdir())
        if video.suffix.lower() in VIDEO_EXTENSIONS
    ]
    return classes, videos


def write_annotations_from_tree(
    root: str | Path, out_dir: str | Path, val_fraction: float = 0.2, seed: int = 0, decoder: str = "decord",
    time_limit: float = 60.0,
) -> TreeAnnotations:
    """Write GluonCV `train.txt`/`val.txt` (paths relative to `root`) and `classInd.txt` into `out_dir`.

    Labels follow the sorted class folder names. Each class is split on its own (seeded shuffle) so both
    lists keep every class; frame counts come from `decoder` (CONFIG.DATA.DECODER), each video opened within
    `time_limit` seconds (CONFIG.DATA.DECODE_TIME_LIMIT's default; 0: none), and videos it cannot open in time are
    left out and returned in `skipped`.
    """
    from trainer.data.decoders import BadVideo, ClipDecoder  # imported here so parsing lists never needs a decoder

    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    root, out_dir = Path(root), Path(out_dir)
    classes, videos = _list_tree(root)
    counting = ClipDecoder(decoder, time_limit=time_limit)  # type: ignore[arg-type]
    rng = random.Random(seed)
    lines: dict[str, list[str]] = {"train": [], "val": []}
    skipped: list[tuple[str, str]] = []
    for label in range(len(classes)):
        members = [video for video, lab in videos if lab == label]
        rng.shuffle(members)
        num_val = round(len(members) * val_fraction)
        for i, video in enumerate(members):
            try:
                frames = count_frames(video, counting)
            except BadVideo as exc:
                skipped.append((str(video), str(exc)))
                continue
            split = "val" if i < num_val else "train"
            lines[split].append(annotation_line(video.relative_to(root).as_posix(), frames, label))
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, entries in lines.items():
        (out_dir / f"{split}.txt").write_text("".join(sorted(entries)))
    write_class_index(out_dir / "classInd.txt", classes)
    return TreeAnnotations(
        train=out_dir / "train.txt",
        val=out_dir / "val.txt",
        class_index=out_dir / "classInd.txt",
        classes=classes,
        skipped=skipped,
    )
