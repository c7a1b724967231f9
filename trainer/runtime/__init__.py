"""The job runtime on a node: standard library only, so it runs before (and without) the training environment.

| module | its one job |
|---|---|
| contract | what the trainer, the runtime and the launcher share: environment, exit statuses, run files, defaults |
| layout | where a job's files are on a node, and the entry point that finds a job's runtime there |
| plan | the node plan: what one node runs, with which environment, who the other members are, every path |
| timing | every interval of the watch, derived from the heartbeat timeout, and the orderings the no-split rule needs |
| schema | the one schema check: JSON read into frozen dataclasses, or refused naming the fault |
| record | the job's record: a typed value with a phase enum, the hub's alone to change |
| messages | what supervisors say to each other, and a node's state: typed, checked at every door |
| supervisor | the node's supervisor: its parts (listener, member, hub host) and its tick |
| listener | the listening side of the watch: who may connect, how often, what is refused |
| member | a member's link to the hub, and the search for the next hub |
| succession | who the next hub is: pure decisions |
| hubhost | the supervisor that hosts the hub: answers members, knows when all heard the end |
| hub | the job's hub: every decision about the job's attempts (pure state) |
| policy | the restart policy: end, restart (with which nodes in which ranks) or wait |
| requeue | on a Slurm site, once the allocation's step ended: the end stands, or Slurm requeues the job (pure) |
| verdict | failure kinds, and which node failed first |
| node | the node's trainer, one attempt at a time: start, watch (exit status, heartbeats), stop |
| beats | what the training processes' heartbeats say: who froze, where each rank is, their effort |
| wire | the watch's protocol: authenticated, bounded JSON lines over TCP |
| procs | the job's processes, found by their environment |
| network | this host's interfaces and addresses (the one reader of `ip -j addr`), and which one routes where |
| nodestate | the node's state file, stop requests, the watch's key, the node's state for training-status.yml |
| report | the job in words, for the controller |
| log | the supervisor's lines, and saying a thing once |
| slurm | a job inside a Slurm allocation (batch step, facts, members), and the slurm-VERBs |
| slurmjob | a Slurm job's folder on the login host, the batch step's typed account, Slurm's commands |
| slurmlogin | a Slurm job from the login host: its batch script and sbatch, status, wait, stop |
"""
