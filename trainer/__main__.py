"""``python -m trainer COMMAND``: one door to the trainer's tools.

    train            DDP training (= python -m trainer.train)
    test             multi-view test of a checkpoint (= python -m trainer.test)
    predict VIDEO    top-k classes of one video (= python -m trainer.predict)
    check-data       open every video of a config's lists with its DECODER and name the bad ones; with
                     --manifest DIR: is DIR a complete, unchanged copy of a staged dataset (stage-data.yml)?
    make-annotations build train/val lists and a class index from a root/<class>/<video> tree
    make-dataset     write a small labelled synthetic H.264 dataset (motion classes) for demos and tests
    fetch-weights N  download model N's published Kinetics weights once into the cache; prints the file's path
                     (N a Hugging Face hub id OWNER/NAME: its snapshot in the Hugging Face cache; prints the folder)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from trainer.data import check_dataset, make_synthetic_dataset, write_annotations_from_tree
from trainer.data.decoders import ClipDecoder, DecoderUnavailable
from trainer.errors import UserError, report_user_errors

TOOLS = {"train": "trainer.train", "test": "trainer.test", "predict": "trainer.predict"}


def require_decoder(choice: str, chosen_by: str) -> None:
    """Before any video is read: a decoder that cannot run on this machine is one error line naming where it was
    chosen (a UserError)."""
    try:
        ClipDecoder(choice)  # type: ignore[arg-type]
    except DecoderUnavailable as exc:
        raise DecoderUnavailable(f"{chosen_by}: {exc}") from None


def check_copy(folders: Sequence[str]) -> int:
    """Each folder against the manifest stage-data.yml wrote beside it: complete and unchanged, or what is wrong."""
    from trainer.data import manifest

    bad = 0
    for folder in folders:
        try:
            check = manifest.verify(str(Path(folder).expanduser().resolve()), adopt=False)
        except manifest.ManifestError as exc:
            raise UserError(str(exc)) from None
        report = manifest.report(folder, check)
        size = f"{report['files']} files, {report['bytes'] / 1e9:.2f} GB, from {report['source']}"
        if check.complete:
            print(f"{folder}: complete and unchanged ({size})")
        else:
            bad += 1
            print(f"{folder}: NOT complete: {manifest.problems(report)} ({size})")
        if check.extra:
            print(f"{folder}: {report['extra']} file(s) not in the manifest ({', '.join(report['examples']['extra'])})")
    return 1 if bad else 0


def check_data(argv: Sequence[str]) -> int:
    if argv and argv[0] == "--manifest":
        if len(argv) < 2:
            raise UserError("check-data --manifest needs the folder(s) to check")
        return check_copy(argv[1:])
    from trainer.train import get_args_parser, load_cli_config

    parser = argparse.ArgumentParser(prog="trainer check-data", parents=[get_args_parser(add_help=False)],
                                     description="decode every video listed by the config's train and val lists "
                                                 "with CONFIG.DATA.DECODER")
    cfg = load_cli_config(parser.parse_args(argv))
    data = cfg.CONFIG.DATA
    require_decoder(data.DECODER, "CONFIG.DATA.DECODER")
    bad = [*check_dataset(data.TRAIN_ANNO_PATH, data.TRAIN_DATA_PATH, data.DECODER, data.DECODE_TIME_LIMIT),
           *check_dataset(data.VAL_ANNO_PATH, data.VAL_DATA_PATH, data.DECODER, data.DECODE_TIME_LIMIT)]
    for path, reason in bad:
        print(f"BAD {path}: {reason}")
    print(f"{len(bad)} bad video(s)")
    return 1 if bad else 0


def make_annotations(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="trainer make-annotations",
                                     description="lists + classInd.txt from a root/<class_name>/<video> tree")
    parser.add_argument("root", type=Path, help="folder with one sub-folder of videos per class")
    parser.add_argument("--out", type=Path, required=True, help="where to write train.txt, val.txt, classInd.txt")
    parser.add_argument("--val-fraction", type=float, default=0.2, help="share of each class held out for val")
    parser.add_argument("--seed", type=int, default=0, help="seed of the per-class split")
    parser.add_argument("--decoder", choices=["decord", "torchcodec", "auto"], default="decord",
                        help="the CONFIG.DATA.DECODER that counts the frames (auto: AV1 videos too)")
    parser.add_argument("--time-limit", type=float, default=60.0,
                        help="seconds each video may take to open (as CONFIG.DATA.DECODE_TIME_LIMIT; 0: none)")
    args = parser.parse_args(argv)
    require_decoder(args.decoder, "--decoder")
    result = write_annotations_from_tree(args.root, args.out, args.val_fraction, args.seed, args.decoder,
                                         args.time_limit)
    for path, reason in result.skipped:
        print(f"skipped {path}: {reason}")
    print(f"{len(result.classes)} classes -> {result.train}, {result.val}, {result.class_index}")
    return 0


def make_dataset(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="trainer make-dataset",
                                     description="synthetic videos whose classes differ only in motion direction")
    parser.add_argument("root", type=Path, help="output folder")
    parser.add_argument("--classes", nargs="+", default=["left", "right"], help="from: left right up down")
    parser.add_argument("--train-per-class", type=int, default=12, help="training videos per class")
    parser.add_argument("--val-per-class", type=int, default=6, help="validation videos per class")
    parser.add_argument("--size", type=int, default=32, help="frame width and height in pixels (even)")
    parser.add_argument("--frames", type=int, default=16, help="frames per video")
    parser.add_argument("--seed", type=int, default=0, help="random seed")
    args = parser.parse_args(argv)
    if (args.root / "classInd.txt").is_file():
        print(f"{args.root} already holds a dataset; kept")  # a second demo run reuses it
        return 0
    paths = make_synthetic_dataset(args.root, args.classes, (args.train_per_class, args.val_per_class),
                                   size=args.size, frames=args.frames, seed=args.seed)
    for key, value in paths.items():
        print(f"{key}: {value}")
    return 0


def fetch_weights(argv: Sequence[str]) -> int:
    from trainer.weights import zoo

    return zoo.main(list(argv))


COMMANDS = {
    "check-data": check_data,
    "make-annotations": make_annotations,
    "make-dataset": make_dataset,
    "fetch-weights": fetch_weights,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in {*TOOLS, *COMMANDS}:
        print(__doc__, file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    if command in TOOLS:
        import importlib

        importlib.import_module(TOOLS[command]).main(rest)
        return 0
    return report_user_errors(lambda: COMMANDS[command](rest))


if __name__ == "__main__":
    sys.exit(main())
