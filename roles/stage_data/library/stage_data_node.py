"""stage_data_node: the node side of roles/stage_data, one call per step (Ansible carries this module, the stage
bookkeeping and trainer/data/manifest.py to the node; nothing is installed there). ``~`` in a path is the cluster
user's home there; the stage folder's names are plugins/module_utils/stage.py's (vidcluster.launcher).

    action=prepare  dest, handle, digest [, manifest (the text), checksum]
        Make the stage folder and dest, point the handle at dest, forget earlier plays' progress files, check that
        rsync runs. With ``manifest`` (the text of DIGEST's manifest), keep it beside the handle. When the manifest
        kept there is DIGEST's, make it dest's, check dest against it and list what dest lacks (the handle's need
        list). Returns dest, stage (absolute), rsync ('' or why it does not run), manifest ('current' or 'stale') and
        check (the check's report, or None); changed when a file of the right content got the manifest's mtime.
    action=source   src, handle, label
        Point the handle at src and write src's manifest beside it (a rebuild hashes only files whose size or mtime
        moved). Returns src, stage, manifest (the file), rsync, build; changed when the manifest changed.
    action=build    src, out, label
        Write src's manifest to out (the controller's cache of it), rebuilding as source does. Returns build.
    action=copy     lock, progress, argv
        Start one rsync (argv) in a daemon of its own that keeps the progress file; returns once it started (fails
        with the reason when it could not: the lock held by a copy that does not stop, no room for the file).
    action=verify   dest [, checksum, read_only]
        Check dest against the manifest beside it. Returns check (its report); changed when mtimes were adopted.
    action=prune    dest
        Delete the files in dest its manifest does not list. Returns deleted (the count, bytes, examples).

A folder that cannot be prepared, described or checked fails naming it (``msg``, and ``error``: the same words, kept
when a task takes the failure in with failed_when: false).
"""

from __future__ import annotations

import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.vidcluster.launcher.plugins.module_utils import manifest, stage

ARGS: dict[str, dict[str, Any]] = {
    "action": {"type": "str", "required": True, "choices": ["prepare", "source", "build", "copy", "verify", "prune"]},
    "dest": {"type": "str"},
    "src": {"type": "str"},
    "handle": {"type": "str"},
    "digest": {"type": "str"},
    "manifest": {"type": "str", "no_log": False},
    "checksum": {"type": "bool", "default": False},
    "read_only": {"type": "bool", "default": False},
    "label": {"type": "str"},
    "out": {"type": "str"},
    "lock": {"type": "str"},
    "progress": {"type": "str"},
    "argv": {"type": "list", "elements": "str"},
}
NEEDS = {"prepare": ["dest", "handle", "digest"], "source": ["src", "handle", "label"],
         "build": ["src", "out", "label"], "copy": ["lock", "progress", "argv"], "verify": ["dest"], "prune": ["dest"]}


def here(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def stage_handle(name: str) -> stage.Handle:
    folder = here(f"~/{stage.STAGE_DIR}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return stage.Handle(folder, name)


def prepare(p: dict[str, Any]) -> dict[str, Any]:
    dest, handle = here(p["dest"]), stage_handle(p["handle"])
    os.makedirs(dest, exist_ok=True)
    manifest.point(handle.path, dest)
    for old in handle.old_progress():
        os.unlink(old)
    out: dict[str, Any] = {"dest": dest, "stage": handle.stage, "rsync": stage.rsync_problem(), "manifest": "stale",
                           "check": None, "changed": False}
    if p["manifest"] is not None:
        if manifest.digest(p["manifest"]) != p["digest"]:
            raise manifest.ManifestError(f"the manifest sent for {dest} arrived damaged (its digest differs)")
        manifest.write_atomically(handle.manifest, p["manifest"])
    try:
        current = manifest.read_manifest(handle.manifest)[1] == p["digest"]
    except manifest.ManifestError:
        current = False
    if current:
        manifest.install(dest, handle.manifest)
        check = manifest.verify(dest, checksum=p["checksum"])
        manifest.write_need(handle.need, check)
        out.update(manifest="current", check=manifest.report(dest, check), changed=check.adopted > 0)
    return out


def source(p: dict[str, Any]) -> dict[str, Any]:
    src, handle = here(p["src"]), stage_handle(p["handle"])
    manifest.point(handle.path, src)
    done = manifest.build(src, handle.manifest, f"{p['label']}:{src}")
    return {"src": src, "stage": handle.stage, "manifest": handle.manifest, "rsync": stage.rsync_problem(),
            "build": done, "changed": bool(done["changed"])}


def build(p: dict[str, Any]) -> dict[str, Any]:
    src = here(p["src"])
    done = manifest.build(src, here(p["out"]), f"{p['label']}:{src}")
    return {"build": done, "changed": bool(done["changed"])}


def verify(p: dict[str, Any]) -> dict[str, Any]:
    dest = here(p["dest"])
    check = manifest.verify(dest, checksum=p["checksum"], adopt=not p["read_only"])
    return {"check": manifest.report(dest, check), "changed": check.adopted > 0}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGS, supports_check_mode=False)
    p = module.params
    missing = [name for name in NEEDS[p["action"]] if p[name] is None]
    if missing:
        module.fail_json(msg=f"action={p['action']} needs {', '.join(missing)}", error="a call without its arguments")
    try:
        if p["action"] == "prepare":
            out = prepare(p)
        elif p["action"] == "source":
            out = source(p)
        elif p["action"] == "build":
            out = build(p)
        elif p["action"] == "verify":
            out = verify(p)
        elif p["action"] == "prune":
            deleted = manifest.prune(here(p["dest"]))
            out = {"deleted": deleted, "changed": bool(deleted["deleted"])}
        else:
            stage.copy(here(p["lock"]), here(p["progress"]), p["argv"], detached=True)
            out = {"changed": True}
    except (OSError, manifest.ManifestError) as exc:
        module.fail_json(msg=str(exc), error=str(exc))
    module.exit_json(**out)


if __name__ == "__main__":
    main()
