"""vidcluster_follow: follow a training job from its hub's node, printing a line when its progress changes.

Runs on the controller (the task is delegated to the hub's node); each poll is one module call on that node, which
waits there (``python -m trainer.runtime wait``; ``verb`` slurm-wait on a Slurm site's login host, which reads the
job from Slurm's queue and the hub's state in the shared home) until the job's progress changes or ``poll_seconds``
pass, so an unchanged job prints nothing and a changed one is printed within a moment. Lines are the job's own words
(trainer/runtime/report.py): epoch, step, losses, accuracy, clips/s, ETA, restarts, silent nodes. The loop is the
launcher's one polling machine (the vidcluster.launcher collection's plugin_utils/polling.py).

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
import time
from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display
from ansible_collections.vidcluster.launcher.plugins.plugin_utils.polling import Poll, on_node
from ansible_collections.vidcluster.launcher.plugins.plugin_utils.trainer import trainer_module

report = trainer_module("runtime.report")
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
        hours = float(a.get("hours", 72))
        silent_since = float(a["silent_since"]) if a.get("silent_since") else None
        # The runtime's wait; on a Slurm site slurm-wait, on the login host (trainer.runtime.slurm.allocation).
        argv = [str(a["python"]), "-I", "-c", str(a["entry"]), str(a.get("verb") or "wait"), "--jobs-dir",
                str(a["jobs_dir"]), "--job", job, "--node", node, str(poll), "--since"]
        heard = {"key": "", "said_silent": False, "ending": 0.0}

        def look() -> dict[str, Any] | None:
            status = self._wait([*argv, str(heard["key"])], task_vars or {})
            if status is not None:
                heard.update(key=report.progress_key(status), said_silent=False)
            return status

        def ended(status: dict[str, Any]) -> dict[str, Any] | None:
            end = report.job_end(status) if status.get("mode") == "hub" or status["state"] != "running" else None
            if end:  # the hub stays until every member has heard the end, then its supervisor exits
                heard["ending"] = heard["ending"] or time.monotonic()
                if status["state"] != "running" or time.monotonic() - float(heard["ending"]) > recheck:
                    return {"outcome": end.state.value, "status": status}
                return None
            if status["state"] == "running" and status.get("mode") != "hub":
                return {"next": "moved", "hub": report.hub_of(status) or node, "status": status}
            if status["state"] != "running":  # its supervisor is gone without an end: the hub may be elsewhere
                return {"next": "silent", "silent_since": time.time(), "status": status}
            return None

        def silent(seconds: float) -> dict[str, Any] | None:
            if not heard["said_silent"]:
                display.display(f"{job}: no answer from {node} (the job's hub) since {time.strftime('%T')}: the job "
                                f"is not affected; following gives up after {grace:.0f} s of silence")
                heard["said_silent"] = True
            if seconds > grace:
                display.display(
                    f"{job}: lost contact with {node} (the job's hub) for more than {grace:.0f} s; this controller "
                    "stops following, and nothing was stopped: the job may still be running (its nodes stop or "
                    f"restart it by themselves if a node fails). Follow it again with: ansible-playbook "
                    f"training-status.yml -e job_id={job} -e follow=true (or run launch-training.yml again: it "
                    "attaches to a running job).")
                return {"outcome": "gave_up"}
            if seconds > recheck:
                return {"next": "silent", "silent_since": time.time() - seconds}
            return None

        def overtime() -> dict[str, Any]:
            display.display(f"{job}: still running after {a.get('hours')} h of following; it keeps running. Follow "
                            f"it again with: ansible-playbook training-status.yml -e job_id={job} -e follow=true")
            return {"outcome": "running"}

        ending = Poll(
            look=look, ended=ended, silent=silent, key=report.progress_line,
            line=lambda status: f"{job}: {report.progress_line(status)}", show=display.display,
            # an answer comes back as soon as the job moves (the node's wait blocks): look again at once
            pause=lambda elapsed, answered: 0.0 if answered else min(poll, 5.0),
            deadline=time.monotonic() + hours * 3600, overtime=overtime,
            silent_for=time.time() - silent_since if silent_since else 0.0,
        ).run()  # fmt: skip
        # The outcome is a fact of the task itself (run_once: every host gets it): a task after this one could not
        # set it where follow.yml includes itself again, since the include's condition (another hub to follow) is
        # inherited by every task of the included file and no longer holds once the job ended.
        facts = {"ddp_launch_outcome": ending["outcome"]} if "outcome" in ending else {}
        return {**result, "changed": False, "hub": node, **ending, "ansible_facts": facts}

    def _wait(self, argv: list[str], task_vars: dict[str, Any]) -> dict[str, Any] | None:
        """The node's state once its progress changed, or None when the node did not answer."""
        out = on_node(self, "ansible.builtin.command", {"argv": argv}, task_vars)
        if out is None:
            return None
        if out.get("rc") != 0:  # the node answered, and the poll itself failed: not silence, a fault to show
            raise AnsibleError(f"following on {argv[argv.index('--node') + 1]} failed: "
                               f"{(out.get('stderr') or out.get('msg') or '').strip()}")
        try:
            return json.loads(out["stdout"])
        except (ValueError, KeyError):
            return None
