"""Ansible callback for the benchmarks: how many module results each host produced (every loop item counts), written
as JSON to $VIDCLUSTER_COUNT_RESULTS when the playbook ends. Enabled by bench/cluster_scale.py only."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

from ansible.plugins.callback import CallbackBase

DOCUMENTATION = """
name: count_results
type: aggregate
short_description: count module results per host (benchmarks)
description: Counts every task result and loop item per host and writes the counts as JSON to $VIDCLUSTER_COUNT_RESULTS.
"""


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "count_results"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def _count(self, result: Any) -> None:
        # A loop's summary result repeats its items, which are counted one by one.
        if "results" not in result._result:
            self.counts[result._host.get_name()] += 1

    v2_runner_on_ok = v2_runner_on_failed = v2_runner_on_skipped = v2_runner_on_unreachable = _count

    def _count_item(self, result: Any) -> None:
        self.counts[result._host.get_name()] += 1

    v2_runner_item_on_ok = v2_runner_item_on_failed = v2_runner_item_on_skipped = _count_item

    def v2_playbook_on_stats(self, stats: Any) -> None:
        path = os.environ.get("VIDCLUSTER_COUNT_RESULTS")
        if path:
            with open(path, "w") as handle:
                json.dump(dict(self.counts), handle)
