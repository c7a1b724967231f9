"""Which nodes see the same folder? Each node leaves a marker in it, then reads which markers it sees.

Run twice by roles/shared_fs with the node's own Python (standard library only), with a token that is new on every
play, so markers of earlier plays or of nodes no longer in the play do not count:

    python3 shared_fs.py mark TOKEN NODE PATH...    leave NODE's marker in PATH/.vidcluster-nodes/ (creates PATH)
    python3 shared_fs.py read TOKEN PATH...         {"PATH": ["node", ...]}: the nodes whose marker of TOKEN is there
    python3 shared_fs.py clean NODE PATH...         remove NODE's marker (and the marker folder once it is empty)

Between the two calls every node of the play has marked (Ansible finishes a task on every host before the next), so
a folder on NFS (or any filesystem several nodes mount) lists all the nodes that share it, and a local folder only
its own node. A folder a node cannot write (a read-only mount) lists nobody.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

MARKERS = ".vidcluster-nodes"


def mark(token: str, node: str, paths: list[str]) -> None:
    for path in paths:
        folder = Path(os.path.expanduser(path)) / MARKERS
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp = folder / f".{node}.{os.getpid()}"
            tmp.write_text(token)
            os.replace(tmp, folder / node)
        except OSError:
            continue  # read-only: this node cannot tell, and will list nobody


def read(token: str, paths: list[str]) -> dict[str, list[str]]:
    found = {}
    for path in paths:
        folder = Path(os.path.expanduser(path)) / MARKERS
        names = []
        for marker in sorted(folder.iterdir()) if folder.is_dir() else []:
            try:
                if not marker.name.startswith(".") and marker.read_text() == token:
                    names.append(marker.name)
            except OSError:
                continue
        found[path] = names
    return found


def clean(node: str, paths: list[str]) -> None:
    for path in paths:
        folder = Path(os.path.expanduser(path)) / MARKERS
        try:
            (folder / node).unlink(missing_ok=True)
            folder.rmdir()
        except OSError:
            continue  # another node's marker is still there (it removes its own), or read-only


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "mark":
        mark(argv[1], argv[2], argv[3:])
        return 0
    if len(argv) >= 2 and argv[0] == "clean":
        clean(argv[1], argv[2:])
        return 0
    if len(argv) >= 2 and argv[0] == "read":
        print(json.dumps(read(argv[1], argv[2:])))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
