"""The controller's side of preparing a dataset (trainer/data/prepare.py): the annotation CSVs read, which node makes
which clip (the plan), and the lists, the class index and the report from what was made. It runs in the trainer's
package on the controller (``python -m trainer.data.prepare_plan plan|lists``, which runs prepare.py's node commands
too, for the controller's own probe), never on a node.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.data import prepare
from trainer.data.prepare import (
    CLASS_INDEX,
    LIST_SUFFIX,
    OWN_FILES,
    REPORT,
    Options,
    PrepareError,
    find_sources,
    read_state,
)

if TYPE_CHECKING:
    from trainer.data.annotations import KineticsClip


def main(argv: list[str]) -> int:
    """The controller's commands (``plan``, ``lists``), and a node's for the controller's own node (prepare.py's)."""
    args = prepare.parser().parse_args(argv)
    if args.command not in prepare.CONTROLLER_COMMANDS:
        return prepare.main(argv)
    if args.command == "plan":
        return prepare.answered(lambda: plan(args.csv, args.index, args.state, _read_json(args.layout),
                                             Options.from_json(json.loads(args.options)), args.out))
    return prepare.answered(lambda: lists(args.catalog, args.state, args.out))


def _read_json(path: str) -> Any:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------------------------------
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
# The lists, the class index and the report


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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
