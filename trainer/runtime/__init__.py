"""The job runtime on a node: standard library only, so it runs before (and without) the training environment.

Four rooms, and what they share:

| package / module | its one job |
|---|---|
| `job/` | **the job's record and what decides it** |
| job.record | the job's record: a typed value with a phase enum, the hub's alone to change |
| job.hub | the job's hub: every decision about the job's attempts (pure state) |
| job.roster | what the hub hears of its members: when each spoke, who is silent, the quorum, who could take a rank |
| job.policy | the restart policy: end, restart (with which nodes in which ranks) or wait |
| job.requeue | on a Slurm site, once the allocation's step ended: the end stands, or Slurm requeues the job (pure) |
| job.verdict | failure kinds, which node failed first, which rank hung |
| job.straggler | slow nodes: named, and swapped for a spare when the rules allow |
| job.pace, job.goodput | what the trainers' steps spend their time on; the job's goodput |
| job.timing | every interval of the watch, from the heartbeat timeout, and the orderings the no-split rule needs |
| `watch/` | **the watch between the job's supervisors** |
| watch.wire | the watch's protocol: authenticated, bounded JSON lines over TCP |
| watch.messages | what supervisors say to each other, and a node's state: typed, checked at every door |
| watch.supervisor | the node's supervisor: its parts (listener, member, hub host) and its tick |
| watch.listener | the listening side of the watch: who may connect, how often, what is refused |
| watch.member | a member's link to the hub, and the search for the next hub |
| watch.hubhost | the supervisor that hosts the hub: answers members, knows when all heard the end |
| watch.succession | who the next hub is: pure decisions |
| `host/` | **this node's side** |
| host.node | the node's trainer, one attempt at a time: start, watch (exit status, heartbeats), stop |
| host.beats | what the training processes' heartbeats say: who froze, where each rank is, their effort |
| host.channel | the channel between the supervisor and its training processes |
| host.procs | the job's processes, found by their environment |
| host.nodestate | the node's state file, stop requests, the watch's key, the node's state for training-status.yml |
| host.network | this host's interfaces and addresses (the one reader of `ip -j addr`), and which one routes where |
| `slurm/` | **a job on a Slurm site** |
| slurm.allocation | a job inside a Slurm allocation (batch step, facts, members), and the slurm-VERBs |
| slurm.account | a Slurm job's folder on the login host, the batch step's typed account, Slurm's commands |
| slurm.login | a Slurm job from the login host: its batch script and sbatch, status, wait, stop |
| shared | |
| contract | what the trainer, the runtime and the launcher share: environment, exit statuses, run files, defaults |
| layout | where a job's files are on a node, and the entry point that finds a job's runtime there |
| plan | the node plan: what one node runs, with which environment, who the other members are, every path |
| schema | the one schema check: JSON read into frozen dataclasses, or refused naming the fault |
| atomic | every file written whole or not at all |
| codeship | the trainer code a job runs, shipped once per version |
| report | the job in words, for the controller |
| log | the supervisor's lines, and saying a thing once |
"""
