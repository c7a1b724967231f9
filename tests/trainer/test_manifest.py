"""trainer/data/manifest.py: what a complete, unchanged copy of a dataset folder is, and what a copy lacks.

Real files in tmp_path, the module's functions and its command line (as the stager runs it on a node)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.data import manifest

SCRIPT = Path(manifest.__file__)


def write(path: Path, data: bytes, mtime: int = 1_700_000_000) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """Names with spaces, non-ASCII letters, bytes that are not UTF-8, shell syntax; and the tools' own files."""
    src = tmp_path / "src"
    write(src / "train" / "a b.mp4", b"a" * 1000)
    write(src / "train" / "ü ñ.mp4", b"b" * 2000)
    write(src / "$(touch x)", b"c")
    write(Path(os.fsdecode(bytes(src) + b"/val/\xff\xfe.mp4")), b"d" * 10)
    write(src / ".vidcluster-partial" / "half.mp4", b"x")  # rsync's partial file: not data
    return src


def copy_of(src: Path, dest: Path, out: Path) -> None:
    """dest becomes a copy of src (times kept, as rsync -t does) holding src's manifest."""
    for rel, _ in manifest.walk(str(src)):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((src / rel).read_bytes())
        st = (src / rel).stat()
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    manifest.install(str(dest), str(out))


def test_build_lists_every_data_file_and_rehashes_only_what_changed(source: Path, tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    first = manifest.build(str(source), str(out), "controller:/src")
    assert (first["files"], first["bytes"], first["hashed"], first["changed"]) == (4, 3011, 4, True)
    entries = {e.path: e for e in manifest.read_manifest(str(out))[0].entries}
    assert sorted(entries) == sorted(["$(touch x)", "train/a b.mp4", "train/ü ñ.mp4", os.fsdecode(b"val/\xff\xfe.mp4")])
    assert entries["train/a b.mp4"].size == 1000 and entries["train/a b.mp4"].mtime_ns == 1_700_000_000 * 10**9
    assert not (tmp_path / "x").exists()

    again = manifest.build(str(source), str(out), "controller:/src")
    assert (again["hashed"], again["changed"], again["digest"]) == (0, False, first["digest"])
    write(source / "train" / "a b.mp4", b"z" * 1000, mtime=1_700_000_100)  # same size, new content and time
    write(source / "new.mp4", b"n" * 5)
    third = manifest.build(str(source), str(out), "controller:/src")
    assert (third["files"], third["hashed"], third["hashed_bytes"], third["changed"]) == (5, 2, 1005, True)


def test_a_symlinked_folder_is_refused_naming_it(source: Path, tmp_path: Path) -> None:
    (source / "more").symlink_to(source / "train")
    with pytest.raises(manifest.ManifestError, match=r"/more: a symlink to a folder"):
        manifest.build(str(source), str(tmp_path / "m.json"), "x")


def test_verify_finds_missing_truncated_and_altered_files_and_adopts_a_moved_mtime(source: Path,
                                                                                    tmp_path: Path) -> None:
    out, dest = tmp_path / "m.json", tmp_path / "dest"
    manifest.build(str(source), str(out), "controller:/src")
    copy_of(source, dest, out)
    check = manifest.verify(str(dest))
    assert check.complete and check.need == [] and check.extra == []

    (dest / "$(touch x)").unlink()
    with open(dest / "train" / "a b.mp4", "r+b") as f:
        f.truncate(10)
    write(dest / "train" / "ü ñ.mp4", b"B" * 2000, mtime=1_700_000_500)  # altered: same size, mtime moved
    write(dest / "val" / "extra.mp4", b"e" * 7)
    os.utime(dest / "val" / os.fsdecode(b"\xff\xfe.mp4"), (1, 1))  # same content, another mtime
    check = manifest.verify(str(dest))
    assert [e.path for e in check.missing] == ["$(touch x)"]
    assert sorted(e.path for e, _ in check.changed) == ["train/a b.mp4", "train/ü ñ.mp4"]
    assert check.extra == [("val/extra.mp4", 7)] and check.adopted == 1
    report = manifest.report(str(dest), check)
    assert (report["need_files"], report["need_bytes"], report["complete"]) == (3, 3001, False)
    # rsync replaces the two changed files (old sizes 10 and 2000 go), writing one file at a time beside its old one.
    assert report["required_bytes"] == 3001 - 2010 + 2000
    need = tmp_path / "need"
    manifest.write_need(str(need), check)
    assert need.read_bytes().split(b"\0") == [b"$(touch x)", b"train/a b.mp4", "train/ü ñ.mp4".encode(), b""]
    # The adopted file now passes the quick check (its mtime is the manifest's).
    assert (dest / "val" / os.fsdecode(b"\xff\xfe.mp4")).stat().st_mtime == 1_700_000_000


def test_checksum_finds_damage_that_kept_size_and_mtime(source: Path, tmp_path: Path) -> None:
    out, dest = tmp_path / "m.json", tmp_path / "dest"
    manifest.build(str(source), str(out), "controller:/src")
    copy_of(source, dest, out)
    write(dest / "train" / "a b.mp4", b"y" * 1000)  # the source's size and mtime
    assert manifest.verify(str(dest)).complete
    assert [e.path for e, _ in manifest.verify(str(dest), checksum=True).changed] == ["train/a b.mp4"]


def test_prune_deletes_only_files_the_manifest_does_not_list(source: Path, tmp_path: Path) -> None:
    out, dest = tmp_path / "m.json", tmp_path / "dest"
    manifest.build(str(source), str(out), "controller:/src")
    copy_of(source, dest, out)
    write(dest / "old" / "deep" / "gone.mp4", b"g" * 3)
    write(dest / ".vidcluster-partial" / "half.mp4", b"h")
    assert manifest.prune(str(dest)) == {"deleted": 1, "deleted_bytes": 3, "examples": ["old/deep/gone.mp4"]}
    assert not (dest / "old").exists()
    assert (dest / ".vidcluster-partial" / "half.mp4").exists() and (dest / manifest.MANIFEST).exists()
    assert manifest.verify(str(dest)).complete


def test_command_line_reports_json_and_errors_in_one_line(source: Path, tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        # Run as a node does: the file alone, no trainer package.
        return subprocess.run([sys.executable, "-I", "-c", SCRIPT.read_text(), *args], capture_output=True,
                              text=True, check=False, cwd=tmp_path)

    built = run("build", str(source), str(tmp_path / "m.json"), "--source", "node1:/src")
    assert built.returncode == 0 and json.loads(built.stdout)["files"] == 4, built.stderr
    dest = tmp_path / "dest"
    checked = run("verify", str(dest), "--manifest", str(tmp_path / "m.json"), "--need", str(tmp_path / "need"))
    report = json.loads(checked.stdout)
    assert (report["missing"], report["source"], report["complete"]) == (4, "node1:/src", False)
    assert (tmp_path / "need").read_bytes().count(b"\0") == 4

    missing = run("verify", str(tmp_path / "nowhere"))
    assert missing.returncode == 2
    assert missing.stderr.strip() == f"error: {tmp_path}/nowhere/.vidcluster-manifest.json: no manifest " \
                                     "(playbooks/stage-data.yml writes it)"


def test_check_data_says_whether_a_folder_is_a_complete_unchanged_copy(source: Path, tmp_path: Path) -> None:
    out, good, bad = tmp_path / "m.json", tmp_path / "good", tmp_path / "bad"
    manifest.build(str(source), str(out), "controller:/data/k400")
    copy_of(source, good, out)
    copy_of(source, bad, out)
    (bad / "train" / "ü ñ.mp4").write_bytes(b"short")

    def check_data(*folders: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "trainer", "check-data", "--manifest", *map(str, folders)],
                              capture_output=True, text=True, check=False, cwd=Path(__file__).resolve().parents[2])

    both = check_data(good, bad)
    assert both.returncode == 1, both.stderr
    assert both.stdout.splitlines() == [
        f"{good}: complete and unchanged (4 files, 0.00 GB, from controller:/data/k400)",
        f"{bad}: NOT complete: 1 changed (train/ü ñ.mp4) (4 files, 0.00 GB, from controller:/data/k400)"]
    missing = check_data(tmp_path / "nowhere")
    assert missing.returncode == 2 and missing.stderr.startswith("error: ") and "no manifest" in missing.stderr
