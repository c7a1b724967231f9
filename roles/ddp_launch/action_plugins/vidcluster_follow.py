"""vidcluster_follow: follow a training job from its hub's node, printing a line when its progress changes.

Runs on the controller (the task is delegated to the hub's node); each poll is one module call on that node, which
waits there (``python -m trainer.runtime wait``; ``verb`` slurm-wait on a Slurm site's login host, which reads the
job from Slurm's queue and the hub's state in the shared home) until the job's progress changes or ``poll_seconds``
pass, so an
unchanged job prints nothing and a changed one is printed within a moment. Lines are the job's own words
(trainer/runtime/report.py): epoch, step, losses, accuracy, clips/s, ETA, restarts, silent nodes.

The controller only listens: a node that does not answer is "not heard from", never a failure of the job. Ends with
``outcome``:
    finished / failed / stopped   the job ended so (``status``: the hub's last state)
    running                       ``hours`` of following passed; the job goes on
    gave_up                       the hub's node has not answered for ``grace_seconds``
and ``next``, when following should go on from another node (the playbook asks every member where the hub is):
    moved                         the node is no longer the job's hub (``hub``: the one it names)
    silent                        the node has not answered for ``recheck_seconds`` (``silent_since`` carries on)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleConnectionFailure, AnsibleError
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: the launcher asks the trainer
from trainer.runtime import report

display = Display()
ARGS = ("python", "entry", "jobs_dir", "job", "node", "poll_seconds", "grace_seconds", "recheck_seconds", "hours",
        "silent_since", "verb")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(ARGS)

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        missing = [name for name in ARGS[:5] if not self._task.args.get(name)]
        if missing:
            raise AnsibleError(f"vidcluster_follow needs {', '.join(missing)}")
        a = self._task.args
        job, node = str(a["job"]), str(a["node"])
        poll = float(a.get("poll_seconds", 30))
        grace = float(a.get("grace_seconds", 600))
        recheck = float(a.get("recheck_seconds", 120))
        deadline = time.monotonic() + float(a.get("hours", 72)) * 3600
        silent_since = float(a["silent_since"]) if a.get("silent_since") else None
        # The runtime's wait; on a Slurm site slurm-wait, on the login host (trainer.runtime.slurm).
        argv = [str(a["python"]), "-I", "-c", str(a["entry"]), str(a.get("verb") or "wait"), "--jobs-dir",
                str(a["jobs_dir"]), "--job", job, "--node", node]
        key, line, said_silent, ending = "", "", False, 0.0
        result.update(changed=False, hub=node)
        while time.monotonic() < deadline:
            status = self._poll([*argv, str(poll), "--since", key], task_vars or {})
            if status is not None:
                silent_since, said_silent = None, False
                key = report.progress_key(status)
                if report.progress_line(status) != line:
                    line = report.progress_line(status)
                    display.display(f"{job}: {line}")
                end = report.job_end(status) if status.get("mode") == "hub" or status["state"] != "running" else None
                if end:  # the hub stays until every member has heard the end, then its supervisor exits
                    ending = ending or time.monotonic()
                    if status["state"] != "running" or time.monotonic() - ending > recheck:
                        return {**result, "outcome": end.state.value, "status": status}
                    continue
                if status["state"] == "running" and status.get("mode") != "hub":
                    return {**result, "next": "moved", "hub": report.hub_of(status) or node, "status": status}
                if status["state"] != "running":  # its supervisor is gone without an end: the hub may be elsewhere
                    return {**result, "next": "silent", "silent_since": time.time(), "status": status}
                continue
            now = time.time()
            silent_since = silent_since or now
            if not said_silent:
                display.display(f"{job}: no answer from {node} (the job's hub) since {time.strftime('%T')}: the job "
                                f"is not affected; following gives up after {grace:.0f} s of silence")
                said_silent = True
            if now - silent_since > grace:
                display.display(
                    f"{job}: lost contact with {node} (the job's hub) for more than {grace:.0f} s; this controller "
                    "stops following, and nothing was stopped: the job may still be running (its nodes stop or "
                    f"restart it by themselves if a node fails). Follow it again with: ansible-playbook "
                    f"training-status.yml -e job_id={job} -e follow=true (or run launch-training.yml again: it "
                    "attaches to a running job).")
                return {**result, "outcome": "gave_up"}
            if now - silent_since > recheck:
                return {**result, "next": "silent", "silent_since": silent_since}
            time.sleep(min(poll, 5.0))
        display.display(f"{job}: still running after {a.get('hours')} h of following; it keeps running. Follow it "
                        f"again with: ansible-playbook training-status.yml -e job_id={job} -e follow=true")
        return {**result, "outcome": "running"}

    def _poll(self, argv: list[str], task_vars: dict[str, Any]) -> dict[str, Any] | None:
        """The node's state once its progress changed, or None when the node did not answer."""
        try:
            out = self._execute_module(module_name="ansible.builtin.command", module_args={"argv": argv},
                                       task_vars=task_vars)
        except AnsibleConnectionFailure:
            return None
        if out.get("unreachable"):
            return None
        if out.get("rc") != 0:  # the node answered, and the poll itself failed: not silence, a fault to show
            raise AnsibleError(f"following on {argv[argv.index('--node') + 1]} failed: "
                               f"{(out.get('stderr') or out.get('msg') or '').strip()}")
        try:
            return json.loads(out["stdout"])
        except (ValueError, KeyError):
            return None
