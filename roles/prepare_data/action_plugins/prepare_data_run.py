"""Action of the prepare_data role: this node's share of the clips, made by trainer/data/prepare.py run, which runs
detached on the node (a long run does not hang on an Ansible connection; a later play stops one an interrupted play
left). The run is watched with the launcher's one polling machine (the collection vidcluster.launcher's
plugin_utils/polling.py) through its progress file: a look every ``poll_seconds`` (less often as the run goes on, up
to ``report_seconds``), a line each time its numbers change, at most every ``report_seconds`` (always at the start
and the end): the clips made and not made of the share, the rate and an ETA. A run whose heartbeat stops for
``silence_seconds`` has failed.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.vidcluster.launcher.plugins.plugin_utils.polling import Poll, on_node


class ActionModule(ActionBase):
    """Start this node's run, watch it, and say how it ended."""

    _requires_connection = True
    _VALID_ARGS = frozenset(("argv", "work", "jobs", "poll_seconds", "report_seconds", "silence_seconds"))

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        self._vars = task_vars or {}
        self._node = str(self._vars["inventory_hostname"])
        result, args = super().run(tmp, task_vars), dict(self._task.args)
        started = on_node(self, "ansible.builtin.command", {"argv": [*args["argv"], "run", args["work"], "--detach"]},
                          self._vars)
        if started is None or started.get("rc") != 0:
            problem = (started or {}).get("stderr") or (started or {}).get("msg") or "the node did not answer"
            raise AnsibleActionFail(f"{self._node}: the run did not start: {problem}")
        final = self._watch(f"{args['work']}/progress.json", int(args["jobs"]), float(args["poll_seconds"]),
                            float(args["report_seconds"]), float(args["silence_seconds"]))
        result.update(changed=final["made"] + final["bad"] > 0, made=final["made"], bad=final["bad"],
                      rc=final.get("rc", -1))
        if final.get("rc") != 0:
            result.update(failed=True, msg=f"{self._node}: the run failed: {final.get('error') or 'no message'} "
                                           f"(its log: {args['work']}/run.log)")
        return result

    def _watch(self, path: str, jobs: int, poll: float, every: float, silence: float) -> dict[str, Any]:
        """Poll until the run ends: the launcher's polling machine, a sign of life being a moving heartbeat."""
        started = time.monotonic()
        last: dict[str, Any] = {"made": 0, "bad": 0}
        self._display.display(f"{self._node}: starting, {jobs} clip(s) to make")

        def look() -> dict[str, Any] | None:
            read = on_node(self, "ansible.builtin.slurp", {"src": path}, self._vars)
            if read is None or read.get("failed"):
                return None
            try:
                state = json.loads(base64.b64decode(read["content"]))
            except ValueError:
                return None
            if isinstance(state, dict):
                last.update(state)
                return state
            return None

        def silent(seconds: float) -> dict[str, Any] | None:
            if seconds <= silence:
                return None
            return {**last, "rc": -1, "error": f"no sign of life from the run for {silence:.0f} s"}

        return Poll(
            look=look, ended=lambda state: state if state.get("finished") else None, silent=silent,
            key=lambda state: (state.get("phase"), state.get("made"), state.get("bad"), state.get("finished")),
            line=lambda state: self._line(state, jobs, time.monotonic() - started), show=self._display.display,
            alive=lambda state, before: before is None or state.get("beat") != before.get("beat"), every=every,
            pause=lambda elapsed, _: min(every, max(poll, elapsed / 10)),  # each look is a module call on the node
        ).run()  # fmt: skip

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
