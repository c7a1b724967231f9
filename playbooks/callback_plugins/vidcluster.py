"""vidcluster: Ansible's default output without the lines that say nothing.

A task shows its banner and its results only when it changed something, failed, could not reach a node, or has a
message for the reader (a debug task); skipped hosts, plain "ok" results, "included" lines and the retries of a task
that polls ("FAILED - RETRYING") are left out. Plays,
the lines the follow and stage-data print while they run, and the recap are as the default callback prints them.
With -v (or more) everything is shown, exactly as by the default callback, which it extends.
"""

from __future__ import annotations

from typing import Any

from ansible import constants as C
from ansible.playbook.task_include import TaskInclude
from ansible.plugins.callback.default import CallbackModule as DefaultCallback

DOCUMENTATION = """
    name: vidcluster
    type: stdout
    short_description: the default output without skipped hosts and results that say nothing
    description:
      - A task shows its banner and results only when it changed something, failed, could not reach a node, or
        has a message for the reader (debug); -v shows everything, as the default callback does.
    extends_documentation_fragment:
      - default_callback
      - result_format_callback
    requirements:
      - set as stdout_callback in ansible.cfg
"""


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "vidcluster"

    def __init__(self) -> None:
        super().__init__()
        self._showing = False  # the result being printed is a message for the reader

    def _quiet(self) -> bool:
        return self._display.verbosity < 1

    def get_option(self, k: str) -> Any:
        if self._quiet() and k in ("display_skipped_hosts", "display_ok_hosts"):
            return k == "display_ok_hosts" and self._showing
        return super().get_option(k)

    def _with_message(self, result: Any, show: Any) -> None:
        self._showing = result.task.action in C._ACTION_DEBUG
        try:
            show(result)
        finally:
            self._showing = False

    def v2_runner_on_ok(self, result: Any) -> None:
        if self._quiet() and isinstance(result.task, TaskInclude):
            return  # an include_role or include_tasks: its tasks speak for themselves
        self._with_message(result, super().v2_runner_on_ok)

    def v2_runner_item_on_ok(self, result: Any) -> None:
        self._with_message(result, super().v2_runner_item_on_ok)

    def v2_playbook_on_include(self, included_file: Any) -> None:
        if not self._quiet():
            super().v2_playbook_on_include(included_file)

    def v2_runner_retry(self, result: Any) -> None:
        if not self._quiet():  # a poll that will be tried again ("FAILED - RETRYING") says nothing yet
            super().v2_runner_retry(result)
