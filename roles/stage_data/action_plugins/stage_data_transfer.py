"""Action of the stage_data role: this node's copy in one round of the plan, watched from the controller.

The copy is one rsync of the files this node lacks (its need list, --files-from): pushed by the controller (the first
copy from a controller folder), pulled by this node from a node with a complete copy over the cluster's SSH mesh, or
copied on this node (its own source folder). files/stage_node.py runs the rsync (detached on the node, so the copy
does not hang on an Ansible connection) and keeps a progress file; this action reads it every ``poll_seconds`` (less
often as a copy goes on, up to ``report_seconds``) and prints one line each time the numbers change (at most every
``report_seconds``; always at the start and the end): this node's files and bytes with a rate and an ETA, and the
same for the whole copy, summed over every node's record in the controller's ``run_dir``. A copy whose heartbeat
stops for ``silence_seconds`` has failed.

No value reaches a shell: rsync runs from an argv (through the command module on a node), and its remote paths are
the stage handles (symlinks named by a hash, under the node user's home) the role made, so a folder named
``$(touch x)`` is only a name.
"""

from __future__ import annotations

import base64
import importlib.util
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

ROLE = Path(__file__).resolve().parents[1]
NODE_SCRIPT = ROLE / "files" / "stage_node.py"
# rsync keeps an interrupted file here (beside it, in the destination) and resumes from it; the name starts like
# every name trainer/data/manifest.py leaves out of a dataset.
PARTIAL_DIR = ".vidcluster-partial"


def _text_filters() -> Any:
    spec = importlib.util.spec_from_file_location("stage_data_filters", ROLE / "filter_plugins" / "stage_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


TEXT = _text_filters()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        self._vars = task_vars or {}
        self._args = dict(self._task.args)
        self._node = str(self._vars["inventory_hostname"])
        t = self._args["transfer"]
        self._label = f"[round {self._args['round']}/{self._args['rounds']}] {self._node} <- {TEXT.sender_name(t)}"
        self._record = Path(self._args["run_dir"]) / f"{self._node}.json"
        start = time.monotonic()
        final = self._push(t) if t["sender"] == TEXT.CONTROLLER else self._pull(t)
        rc = int(final.get("rc", -1))
        result.update(changed=int(final["files"]) > 0, files=final["files"], bytes=final["bytes"],
                      sent=final.get("sent", 0), received=final.get("received", 0), rc=rc,
                      seconds=round(time.monotonic() - start, 1), sender=t["sender"])  # fmt: skip
        if rc != 0:
            where = TEXT.CONTROLLER if t["sender"] == TEXT.CONTROLLER else self._node
            cause = f"rsync is not installed on {where}" if rc == 127 else f"rsync exited {rc}"
            result.update(failed=True, msg=f"{self._label}: {cause}: {final.get('error') or 'no message'}")
        return result

    # ---- the three ways a node gets its copy ----
    def _rsync(self, need: str) -> list[str]:
        argv = ["rsync", "-t", "-L", "-I", "--from0", f"--files-from={need}", f"--partial-dir={PARTIAL_DIR}",
                "--out-format=%i %l", "--stats", f"--timeout={int(self._args['io_timeout'])}"]
        if int(self._args.get("bwlimit_kbps") or 0) > 0:
            argv.append(f"--bwlimit={int(self._args['bwlimit_kbps'])}")
        return argv

    def _push(self, t: dict[str, Any]) -> dict[str, Any]:
        """The controller sends the first copy: rsync runs here, to this node's stage handle; the node's need list
        is read on the node (--files-from=:PATH)."""
        host = str(self._connection.get_option("host"))
        target = f"[{host}]" if ":" in host else host
        argv = [*self._rsync(f":{self._args['need_rel']}"), "-e", self._ssh_command(),
                f"{self._args['source']}/", f"{target}:{self._args['dest_handle_rel']}/"]
        progress = Path(self._args["run_dir"]) / f"{self._node}.progress"
        proc = subprocess.Popen([sys.executable, str(NODE_SCRIPT), "copy", self._args["controller_lock"],
                                 str(progress), *argv],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        def look() -> dict[str, Any] | None:
            state = _json(progress.read_bytes()) if progress.exists() else None
            if (state is None or not state.get("done")) and proc.poll() is not None:
                error = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip()
                return {**(state or {"files": 0, "bytes": 0}), "done": True, "rc": proc.returncode or 1,
                        "error": error or "the copy ended without a word"}
            return state

        return self._follow(t, look)

    def _pull(self, t: dict[str, Any]) -> dict[str, Any]:
        """This node copies from another node's complete copy (over the SSH mesh), or from its own source folder.
        stage_node.py runs the rsync detached on the node; its progress file is read here."""
        source = self._args["source"] if t["sender"] == self._node else f"{t['sender']}:{self._args['source']}"
        argv = [*self._rsync(self._args["need"]), "-e", "ssh -o BatchMode=yes", f"{source}/", f"{self._args['dest']}/"]
        progress = self._args["progress"]
        started = self._execute_module(
            module_name="ansible.builtin.command", task_vars=self._vars,
            module_args={"argv": [self._args["python"], "-c", NODE_SCRIPT.read_text(), "copy", self._args["lock"],
                                  progress, "--detach", *argv]},
        )  # fmt: skip
        if started.get("rc") != 0:
            problem = started.get("stderr") or started.get("msg") or "no message"
            raise AnsibleActionFail(f"{self._label}: the copy did not start: {problem}")

        def look() -> dict[str, Any] | None:
            read = self._execute_module(module_name="ansible.builtin.slurp", module_args={"src": progress},
                                        task_vars=self._vars)
            return None if read.get("failed") else _json(base64.b64decode(read["content"]))

        return self._follow(t, look)

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
    def _follow(self, t: dict[str, Any], look: Any) -> dict[str, Any]:
        """Poll until the copy ends; one line per change of the numbers (at most every report_seconds)."""
        started, shown_at, shown = time.monotonic(), 0.0, (0, 0, False)  # the start has its own line
        poll, every = float(self._args["poll_seconds"]), float(self._args["report_seconds"])
        silence = float(self._args["silence_seconds"])
        last, heard = None, started
        self._display.display(f"{self._label}: starting, {TEXT.files(t['files'])}, {TEXT.human(t['bytes'])}")
        while True:
            state = look()
            now = time.monotonic()
            if state is not None and state != last:
                last, heard = state, now
            elif now - heard > silence:
                return {**(last or {"files": 0, "bytes": 0}), "done": True, "rc": -1,
                        "error": f"no sign of life from the copy for {silence:.0f} s"}
            if state is not None:
                numbers = (state.get("files"), state.get("bytes"), state.get("done"))
                self._write_record(t, state)
                if numbers != shown and (state.get("done") or now - shown_at >= every):
                    self._display.display(self._line(t, state, now - started))
                    shown, shown_at = numbers, now
                if state.get("done"):
                    return state
            # Each look is a module call on the node: a long copy is looked at less often, never past every line.
            time.sleep(min(every, max(poll, (now - started) / 10)))

    def _write_record(self, t: dict[str, Any], state: dict[str, Any]) -> None:
        record = {"sender": t["sender"], "files": state.get("files", 0), "bytes": state.get("bytes", 0),
                  "sent": state.get("sent", 0), "received": state.get("received", 0), "done": bool(state.get("done"))}
        tmp = self._record.with_suffix(".tmp")
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self._record)

    def _line(self, t: dict[str, Any], state: dict[str, Any], seconds: float) -> str:
        files, done = int(state.get("files", 0)), int(state.get("bytes", 0))
        if state.get("done"):
            rate = f"{TEXT.human(done / seconds)}/s" if seconds > 0 else "-"
            mine = f"done, {TEXT.files(files)}, {TEXT.human(done)} in {seconds:.0f} s ({rate})"
            if state.get("rc"):
                mine = f"FAILED after {TEXT.files(files)}, {TEXT.human(done)}: {state.get('error') or 'no message'}"
        else:
            mine = (f"{files}/{t['files']} files, {TEXT.human(done)}/{TEXT.human(t['bytes'])}, "
                    f"{TEXT.rate_eta(done, t['bytes'], seconds)}")
        records = [_json(p.read_bytes()) for p in Path(self._args["run_dir"]).glob("*.json")]
        all_files = sum(int(r.get("files", 0)) for r in records if r)
        all_bytes = sum(int(r.get("bytes", 0)) for r in records if r)
        total_files, total_bytes = int(self._args["total_files"]), int(self._args["total_bytes"])
        elapsed = time.time() - float(self._args["started"])
        return (f"{self._label}: {mine} | all: {all_files}/{total_files} files, {TEXT.human(all_bytes)}/"
                f"{TEXT.human(total_bytes)}, {TEXT.rate_eta(all_bytes, total_bytes, elapsed)}")


def _json(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
