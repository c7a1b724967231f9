"""Every interval of the watch derives from the heartbeat timeout in one place (trainer.runtime.job.timing), and the
orderings the no-split rule needs hold for every setting a plan may carry; a plan whose settings break them is refused
naming the rule."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from tests.runtime.test_plan import job, plans
from trainer.runtime.job.timing import TICK, TimingError, Timings
from trainer.runtime.plan import NodePlan, PlanError


@pytest.mark.parametrize(("heartbeat_timeout", "stop_grace"),
                         list(itertools.product([2.5, 3, 4, 10, 60, 600], [0, 1, 5, 15, 120])))
def test_the_old_attempt_is_gone_before_a_new_hub_can_start_one(heartbeat_timeout: float, stop_grace: float) -> None:
    t = Timings.derive(heartbeat_timeout, stop_grace, node_wait=300)
    assert t.lease < t.loss  # the old hub gives up on its members before they give up on it
    # after a cut at 0: the old hub stops its attempt, its members' trainers are killed a stop grace later ...
    old_gone = t.lease + TICK + t.report_every + t.stop_grace + TICK
    # ... before a member of the other side (which heard the old hub a report ago at most) takes over and waits
    assert old_gone < t.loss - t.report_every + t.takeover_wait
    assert t.report_every < t.lease and t.settle <= t.report_every and t.waiting_report <= t.report_every
    assert t.confirm_stop > t.stop_grace and t.search_give_up >= 3 * t.loss


def test_settings_that_break_the_rule_are_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(TimingError, match=r"reports \(0.5 s\) within the lease \(0.5 s\)"):
        Timings.derive(1.0, 5, node_wait=300)
    good = Timings.derive(10, 5, node_wait=300)
    with pytest.raises(TimingError, match=r"lease \(10 s\) < loss \(10 s\)"):
        dataclasses.replace(good, lease=10).check()
    with pytest.raises(TimingError, match=r"the old attempt gone .* before a new hub's first attempt"):
        dataclasses.replace(good, takeover_wait=0).check()  # a new hub with no stop grace
    with pytest.raises(TimingError, match=r"watch: hang_factor 1.5 is below 2"):
        Timings.derive(10, 5, node_wait=300, hang_factor=1.5)
    plan = plans(job(["/home/a", "/home/b"]))["n0"]
    data = json.loads(plan.to_json())
    data["watch"]["heartbeat_timeout"] = 1
    with pytest.raises(PlanError, match="plan: heartbeat_timeout 1 s with stop_grace 15 s breaks"):
        NodePlan.from_dict(data)
