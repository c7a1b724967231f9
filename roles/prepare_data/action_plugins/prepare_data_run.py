"""Action of the prepare_data role: this node's share of the clips, made by trainer/data/prepare.py run, which runs
detached on the node (a long run does not hang on an Ansible connection; a later play stops one an interrupted play
left). Its progress file is read every ``poll_seconds`` (less often as the run goes on, up to ``report_seconds``), and
a line is printed each time its numbers change, at most every ``report_seconds`` (always at the start and the end):
clips made and not made of the share, the rate and an ETA. A run whose heartbeat stops for ``silence_seconds`` has
failed.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase


class ActionModule(ActionBase):
    """Start this node's run, follow it, and say how it ended."""

    _requires_connection = True

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        self._vars = task_vars or {}
        self._node = str(self._vars["inventory_hostname"])
        result, args = super().run(tmp, task_vars), dict(self._task.args)
        started = self._command([*args["argv"], "run", args["work"], "--detach"])
        if started.get("rc") != 0:
            problem = started.get("stderr") or started.get("msg") or "no message"
            raise AnsibleActionFail(f"{self._node}: the run did not start: {problem}")
        final = self._follow(f"{args['work']}/progress.json", int(args["jobs"]), float(args["poll_seconds"]),
                             float(args["report_seconds"]), float(args["silence_seconds"]))
        result.update(changed=final["made"] + final["bad"] > 0, made=final["made"], bad=final["bad"],
                      rc=final.get("rc", -1))
        if final.get("rc") != 0:
            result.update(failed=True, msg=f"{self._node}: the run failed: {final.get('error') or 'no message'} "
                                           f"(its log: {args['work']}/run.log)")
        return result

    def _command(self, argv: list[str]) -> dict[str, Any]:
        return self._execute_module(module_name="ansible.builtin.command", module_args={"argv": argv},
                                    task_vars=self._vars)

    def _look(self, path: str) -> dict[str, Any] | None:
        read = self._execute_module(module_name="ansible.builtin.slurp", module_args={"src": path},
                                    task_vars=self._vars)
        if read.get("failed"):
            return None
        try:
            state = json.loads(base64.b64decode(read["content"]))
        except ValueError:
            return None
        return state if isinstance(state, dict) else None

    def _follow(self, path: str, jobs: int, poll: float, every: float, silence: float) -> dict[str, Any]:
        """Poll until the run ends; one line per change of its numbers (at most every ``every`` seconds)."""
        started = time.monotonic()
        shown_at, shown = 0.0, None
        beat, heard = None, started
        self._display.display(f"{self._node}: starting, {jobs} clip(s) to make")
        while True:
            state = self._look(path)
            now = time.monotonic()
            if state is not None and state.get("beat") != beat:
                beat, heard = state.get("beat"), now
            elif now - heard > silence:
                return {"made": 0, "bad": 0, "rc": -1, "error": f"no sign of life from the run for {silence:.0f} s"}
            if state is not None:
                numbers = (state.get("phase"), state.get("made"), state.get("bad"), state.get("finished"))
                if numbers != shown and (state.get("finished") or now - shown_at >= every):
                    self._display.display(self._line(state, jobs, now - started))
                    shown, shown_at = numbers, now
                if state.get("finished"):
                    return state
            time.sleep(min(every, max(poll, (now - started) / 10)))

    def _line(self, state: dict[str, Any], jobs: int, seconds: float) -> str:
        made, bad = int(state.get("made", 0)), int(state.get("bad", 0))
        not_made = f", {bad} could not be made" if bad else ""
        if state.get("finished"):
            if state.get("rc"):
                return f"{self._node}: FAILED after {made + bad}/{jobs} clips: {state.get('error') or 'no message'}"
            return f"{self._node}: done, {made} clip(s) made{not_made} in {seconds:.0f} s"
        if state.get("phase") in ("fetching", "sending"):
            what = "its sources" if state["phase"] == "fetching" else "the clips to the destination"
            return f"{self._node}: {state['phase']} {what}"
        done = made + bad
        rate = done / seconds if seconds > 0 else 0.0
        eta = f", ETA {(jobs - done) / rate:.0f} s" if rate > 0 else ""
        return f"{self._node}: {done}/{jobs} clips{not_made}, {rate:.2f} clips/s{eta}"
