"""Action of the stage_data role: this node's copy in one round of the plan, watched from the controller.

The copy is one rsync of the files this node lacks (its need list, --files-from), along the route the plan gave it
(filter_plugins/stage_data.py, ``stage_data_routes``): pushed by the controller (the first copy from a controller
folder), pulled by this node from a node with a complete copy over the cluster's SSH mesh, or copied on this node
(its own source folder). The copy runs detached (the collection vidcluster.launcher's module_utils/stage.py: on the
node through the role's stage_data_node module, so the copy does not hang on an Ansible connection; on the
controller as a child) and keeps a progress file; this action watches it with the launcher's one polling machine
(plugin_utils/polling.py): a look every ``poll_seconds`` (less often as a copy goes on, up to ``report_seconds``),
a line each time the numbers change (at most every ``report_seconds``; always at the start and the end) with this
node's files and bytes, a rate and an ETA, and the same for the whole copy, summed over every transfer's record in
the controller's run folder. A copy whose heartbeat stops for ``silence_seconds`` has failed.

No value reaches a shell: rsync runs from an argv, and its remote paths are the stage handles (symlinks named by a
hash, under the node user's home), so a folder named ``$(touch x)`` is only a name.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.vidcluster.launcher.plugins.module_utils import stage
from ansible_collections.vidcluster.launcher.plugins.plugin_utils.polling import Poll, on_node
from ansible_collections.vidcluster.launcher.plugins.plugin_utils.trainer import trainer_module
from ansible_collections.vidcluster.launcher.plugins.plugin_utils.words import (
    CONTROLLER,
    files,
    human,
    rate_eta,
    sender_name,
)

atomic = trainer_module("runtime.atomic")  # the one way a file others read is replaced

# rsync keeps an interrupted file here (beside it, in the destination) and resumes from it; the name starts like
# every name trainer/data/manifest.py leaves out of a dataset.
PARTIAL_DIR = ".vidcluster-partial"
SETTINGS = ("round", "rounds", "started", "total_files", "total_bytes", "bwlimit_kbps", "io_timeout", "poll_seconds",
            "report_seconds", "silence_seconds", "cache", "token")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True
    _VALID_ARGS = frozenset(("transfer", *SETTINGS))

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        self._vars = task_vars or {}
        self._args = dict(self._task.args)
        self._node = str(self._vars["inventory_hostname"])
        self._controller = stage.Controller(str(self._args["cache"]), str(self._args["token"]))
        t = self._args["transfer"]
        self._label = f"[round {self._args['round']}/{self._args['rounds']}] {self._node} <- {sender_name(t)}"
        start = time.monotonic()
        final = self._push(t) if t["kind"] == "push" else self._pull(t)
        rc = int(final.get("rc", -1))
        result.update(changed=int(final["files"]) > 0, files=final["files"], bytes=final["bytes"],
                      sent=final.get("sent", 0), received=final.get("received", 0), rc=rc,
                      seconds=round(time.monotonic() - start, 1), sender=t["sender"])  # fmt: skip
        if rc != 0:
            where = CONTROLLER if t["kind"] == "push" else self._node
            cause = f"rsync is not installed on {where}" if rc == 127 else f"rsync exited {rc}"
            result.update(failed=True, msg=f"{self._label}: {cause}: {final.get('error') or 'no message'}")
        return result

    # ---- the ways a node gets its copy ----
    def _rsync(self, t: dict[str, Any]) -> list[str]:
        argv = ["rsync", "-t", "-L", "-I", "--from0", f"--files-from={t['need']}", f"--partial-dir={PARTIAL_DIR}",
                "--out-format=%i %l", "--stats", f"--timeout={int(self._args['io_timeout'])}"]
        if int(self._args.get("bwlimit_kbps") or 0) > 0:
            argv.append(f"--bwlimit={int(self._args['bwlimit_kbps'])}")
        return argv

    def _push(self, t: dict[str, Any]) -> dict[str, Any]:
        """The controller sends the first copy: the copy runs here (stage.py as a child), rsync to this node's
        handle; the node's need list is read on the node (--files-from=:PATH)."""
        c = self._connection
        host = str(c.get_option("host"))
        target = f"[{host}]" if ":" in host else host
        argv = [*self._rsync(t), "-e", self._ssh_command(), f"{t['source']}/", f"{target}:{t['dest']}/"]
        address = f"{c.get_option('remote_user') or ''}@{target}:{c.get_option('port') or 22}"
        lock = self._controller.lock(stage.Handle(stage.STAGE_DIR, t["handle"]), address)
        progress = Path(t["progress"])
        proc = subprocess.Popen([sys.executable, stage.__file__, "copy", lock, str(progress), *argv],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        def look() -> dict[str, Any] | None:
            state = _json(progress.read_bytes()) if progress.exists() else None
            if (state is None or not state.get("done")) and proc.poll() is not None:
                error = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip()
                return {**(state or {"files": 0, "bytes": 0}), "done": True, "rc": proc.returncode or 1,
                        "error": error or "the copy ended without a word"}
            return state

        return self._watch(t, look)

    def _pull(self, t: dict[str, Any]) -> dict[str, Any]:
        """This node copies from another node's complete copy (over the SSH mesh), or from its own source folder:
        the role's stage_data_node module starts the copy detached on the node; its progress file is read here."""
        argv = [*self._rsync(t), "-e", "ssh -o BatchMode=yes", f"{t['source']}/", f"{t['dest']}/"]
        started = self._execute_module(
            module_name="stage_data_node", task_vars=self._vars,
            module_args={"action": "copy", "lock": t["lock"], "progress": t["progress"], "argv": argv},
        )  # fmt: skip
        if started.get("failed") or started.get("unreachable"):
            raise AnsibleActionFail(f"{self._label}: the copy did not start: {started.get('msg') or 'no message'}")

        def look() -> dict[str, Any] | None:
            read = on_node(self, "ansible.builtin.slurp", {"src": t["progress"]}, self._vars)
            return None if read is None or read.get("failed") else _json(base64.b64decode(read["content"]))

        return self._watch(t, look)

    def _ssh_command(self) -> str:
        """OpenSSH as Ansible reaches this node (address, port, user, key, the inventory's ssh arguments: host keys
        stay verified), one word per argument, quoted as rsync's -e reads them."""
        c = self._connection
        if c.transport not in ("ssh", "ansible.builtin.ssh"):
            raise AnsibleActionFail(f"{self._node}: the first copy goes from the controller with rsync over OpenSSH; "
                                    f"connection '{c.transport}' is not supported (use ssh)")
        words = [c.get_option("ssh_executable") or "ssh", "-o", "BatchMode=yes", "-o", "Compression=no"]
        for flag, option in (("-p", "port"), ("-l", "remote_user"), ("-i", "private_key_file")):
            value = c.get_option(option)
            if value:
                words += [flag, os.path.expanduser(str(value))]
        for option in ("ssh_common_args", "ssh_extra_args"):
            words += shlex.split(c.get_option(option) or "")
        return " ".join(shlex.quote(word) for word in words)

    # ---- watching ----
    def _watch(self, t: dict[str, Any], look_once: Any) -> dict[str, Any]:
        """Poll until the copy ends: the launcher's polling machine, a sign of life being a moving heartbeat."""
        started = time.monotonic()
        poll, every = float(self._args["poll_seconds"]), float(self._args["report_seconds"])
        silence = float(self._args["silence_seconds"])
        last: dict[str, Any] = {"files": 0, "bytes": 0}
        self._display.display(f"{self._label}: starting, {files(t['files'])}, {human(t['bytes'])}")

        def look() -> dict[str, Any] | None:
            state = look_once()
            if state is not None:
                last.update(state)
                self._write_record(t, state)
            return state

        def silent(seconds: float) -> dict[str, Any] | None:
            if seconds <= silence:
                return None
            return {**last, "done": True, "rc": -1, "error": f"no sign of life from the copy for {silence:.0f} s"}

        return Poll(
            look=look, ended=lambda state: state if state.get("done") else None, silent=silent,
            key=lambda state: (state.get("files"), state.get("bytes"), state.get("done")),
            line=lambda state: self._line(t, state, time.monotonic() - started), show=self._display.display,
            alive=lambda state, before: state != before, every=every, said=(0, 0, False),  # the start's own line
            # each look is a module call on the node: a long copy is looked at less often, never past every line
            pause=lambda elapsed, _: min(every, max(poll, elapsed / 10)),
        ).run()  # fmt: skip

    def _write_record(self, t: dict[str, Any], state: dict[str, Any]) -> None:
        record = {"sender": t["sender"], "files": state.get("files", 0), "bytes": state.get("bytes", 0),
                  "sent": state.get("sent", 0), "received": state.get("received", 0), "done": bool(state.get("done"))}
        atomic.write(t["record"], json.dumps(record), atomic.SHARED)

    def _line(self, t: dict[str, Any], state: dict[str, Any], seconds: float) -> str:
        done_files, done = int(state.get("files", 0)), int(state.get("bytes", 0))
        if state.get("done"):
            rate = f"{human(done / seconds)}/s" if seconds > 0 else "-"
            mine = f"done, {files(done_files)}, {human(done)} in {seconds:.0f} s ({rate})"
            if state.get("rc"):
                mine = f"FAILED after {files(done_files)}, {human(done)}: {state.get('error') or 'no message'}"
        else:
            mine = (f"{done_files}/{t['files']} files, {human(done)}/{human(t['bytes'])}, "
                    f"{rate_eta(done, t['bytes'], seconds)}")
        records = [_json(p.read_bytes()) for p in Path(self._controller.run_dir).glob("*.json")]
        all_files = sum(int(r.get("files", 0)) for r in records if r)
        all_bytes = sum(int(r.get("bytes", 0)) for r in records if r)
        total_files, total_bytes = int(self._args["total_files"]), int(self._args["total_bytes"])
        elapsed = time.time() - float(self._args["started"])
        return (f"{self._label}: {mine} | all: {all_files}/{total_files} files, {human(all_bytes)}/"
                f"{human(total_bytes)}, {rate_eta(all_bytes, total_bytes, elapsed)}")


def _json(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
