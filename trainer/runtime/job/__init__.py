"""The job's record and what decides it: the record, the hub's state machine and what it hears of its members, the
restart and requeue policies, failure verdicts, stragglers, goodput, the watch's timings.
"""
