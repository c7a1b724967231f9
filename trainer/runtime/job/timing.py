"""Every interval of the job's watch, derived from the plan's heartbeat timeout (and stop grace) here and nowhere
else, with the ordering the no-split rule needs checked (NVIDIA's resiliency extension derives its timeouts the same
way, in timeouts_calc.py).

The rule (trainer.runtime.watch.supervisor): two groups of nodes cut off from each other never both train. A hub starts
an attempt only while it hears a majority; after a cut that leaves the hub without one, from the moment C of the cut:

    the old hub stops its attempt    once the members it no longer hears leave its majority, ``lease`` after it last
                                     heard them (at C - ``report_every`` or later), on its next tick; its members learn
                                     it at their next report and give their trainers SIGTERM, SIGKILL ``stop_grace``
                                     later (on a tick): all gone by C + lease + 2 TICK + report_every + stop_grace;
    the others count the hub lost    ``loss`` after they last heard it (C - ``report_every`` at the earliest), and one
                                     of them takes over: at C + loss - report_every at the earliest;
    the new hub starts an attempt    ``takeover_wait`` after it took over, at the earliest.

So lease < loss (the old hub gives up first), and takeover_wait is the stop grace and what the old hub's side needs
beyond ``loss`` to pass its stop on: ``check`` asserts both orderings, whatever changes the formulas here.

A rank is hung (trainer.runtime.job.verdict.hung) when its step has not advanced for ``hang_factor`` times its usual
step time, and no less than ``hang_floor`` (15 s, or the heartbeat timeout when that is shorter; ``checkpoint_floor``,
the heartbeat timeout, for a rank saving a checkpoint, which a large model's takes), while the other ranks wait for it
in a collective. A member whose ranks have stalled for ``stall_report`` reports at the ``waiting_report`` cadence, so
that the hub judges them, and the hung node hears it, within moments of the floor: a stuck rank is named, and the job
restarted, within 30 s of its last step at the defaults (a 60 s heartbeat timeout, whose reports come every 10 s).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_HANG_FACTOR = 10.0  # the plan's watch.hang_factor when the job description has none (vidcluster_hang_factor)
MIN_HANG_FACTOR = 2.0  # below this, an uneven step would be taken for a hang
# A rank's step stalls this long at least before it is hung: far beyond a step of a healthy GPU job (0.2 to 2 s) and
# beyond that of a node slowed tenfold (a straggler, which trainer.runtime.job.straggler swaps, not a hang), short
# enough for the job to restart within 30 s of a stuck rank's last step.
HANG_FLOOR_S = 15.0
TICK = 0.5  # a supervisor's tick: it polls its trainer and acts on the record this often
# A member whose trainer has stopped (exited or parked) asks the hub what comes next this often at least: the next
# attempt reaches it within this much of the hub's decision.
WAITING_REPORT_S = 0.25


class TimingError(ValueError):
    """Watch settings under which the no-split rule would not hold (the message names the inequality)."""


@dataclass(frozen=True)
class Timings:
    heartbeat_timeout: float
    stop_grace: float  # SIGTERM (a checkpoint at a common step) to SIGKILL
    report_every: float  # a member's report to the hub, and a training process's heartbeat
    waiting_report: float  # a member's report while its trainer has stopped and it waits on the hub
    lease: float  # the hub counts a member in its majority this long after hearing it
    loss: float  # silence after which a member (or the hub) is lost, and a heartbeat makes a trainer frozen
    settle: float  # after the first failure of an attempt, for its cause to arrive, before the hub names it
    confirm_stop: float  # a member has this long to confirm its trainer stopped, or it is lost
    takeover_wait: float  # a hub that took over starts no attempt before this
    takeover_join: float  # a hub that took over counts a member that never joins it lost after this
    dial: float  # connecting to a supervisor and hearing its first answer
    reply_wait: float  # a member waits this long for the hub's answer to its report
    next_report: float  # the hub's side of a link waits this long for the member's next report
    retry: float  # a member retries a broken link to the hub after this
    search_pause: float  # between two tries of the search for a new hub
    search_give_up: float  # the search for a new hub gives up after this
    hang_factor: float  # a rank whose step stalls this many times its usual step time is hung...
    hang_floor: float  # ...once it has stalled this long at least
    checkpoint_floor: float  # ...and this long in a checkpoint
    stall_report: float  # a member whose ranks' steps stalled this long reports at the waiting_report cadence

    @classmethod
    def derive(cls, heartbeat_timeout: float, stop_grace: float, node_wait: float,
               hang_factor: float = DEFAULT_HANG_FACTOR) -> Timings:
        t = heartbeat_timeout
        beat, lease, loss = max(TICK, t / 6), t / 2, t
        timings = cls(
            heartbeat_timeout=t, stop_grace=stop_grace, report_every=beat, waiting_report=min(beat, WAITING_REPORT_S),
            lease=lease, loss=loss, settle=min(3.0, t / 6), confirm_stop=stop_grace + min(30.0, t),
            takeover_wait=stop_grace + max(0.0, lease + 2 * beat + 2 * TICK - loss) + TICK, takeover_join=t,
            dial=min(5.0, t), reply_wait=min(2 * beat + 5, loss), next_report=t, retry=min(2.0, beat),
            search_pause=min(3.0, t / 4), search_give_up=max(node_wait, 3 * t), hang_factor=hang_factor,
            hang_floor=min(loss, HANG_FLOOR_S), checkpoint_floor=loss, stall_report=min(loss, HANG_FLOOR_S) / 2,
        )
        timings.check()
        return timings

    def check(self) -> None:
        """Refuse timings that break the no-split rule or drop healthy links (see the module docstring)."""
        old_gone = self.lease + 2 * TICK + self.report_every + self.stop_grace
        new_start = self.loss - self.report_every + self.takeover_wait
        rules = (
            (self.lease < self.loss, f"lease ({self.lease:g} s) < loss ({self.loss:g} s)"),
            (old_gone < new_start, f"the old attempt gone ({old_gone:g} s after a cut) before a new hub's first "
                                   f"attempt ({new_start:g} s)"),
            (self.report_every < self.lease, f"reports ({self.report_every:g} s) within the lease ({self.lease:g} s)"),
        )
        if not self.hang_factor >= MIN_HANG_FACTOR:
            raise TimingError(f"watch: hang_factor {self.hang_factor:g} is below {MIN_HANG_FACTOR:g} (a slow step "
                              "would be taken for a hung rank)")
        broken = [words for holds, words in rules if not holds]
        if broken:
            raise TimingError(f"heartbeat_timeout {self.heartbeat_timeout:g} s with stop_grace {self.stop_grace:g} s "
                              f"breaks: {'; '.join(broken)} (raise heartbeat_timeout)")
