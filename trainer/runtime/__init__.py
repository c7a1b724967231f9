"""The job runtime on a node: standard library only, so it runs before (and without) the training environment.

| module | its one job |
|---|---|
| layout | where a job's files are on a node, and the entry point that finds a job's runtime there |
| plan | the node plan: what one node runs, with which environment, who the other members are, every path |
| supervisor | the node's supervisor: runs the node's trainer as the job's record says, takes part in the watch |
| node | the node's trainer, one attempt at a time: start, watch (exit status, heartbeats), stop |
| hub | the job's hub: the record of the job, its attempts and every decision about them |
| policy | the restart policy: end, restart (with which nodes in which ranks) or wait |
| verdict | failure kinds, and which node failed first |
| wire | the watch's protocol: authenticated, bounded JSON lines over TCP |
| procs | the job's processes, found by their environment |
| nodestate | the node's state file, stop requests, the node's state for training-status.yml |
| report | the job in words, for the controller |
"""
