#!/usr/bin/env bash
# The demo: a 2-node training cluster on this machine, set up and trained by the project's own playbooks.
#   bash scripts/demo.sh          (as root, on Debian; about 10 minutes from nothing, most of it installing torch)
# 1. installs what is missing (scripts/bootstrap.sh: Debian packages, the .venv virtualenv);
# 2. makes a local 2-node cluster "demo": two network-namespace hosts with their own sshd and home
#    (playbooks/local-cluster.yml; inventory in .local-cluster/demo/inventory.yml, copied to inventory/hosts.yml);
# 3. sets the cluster up with setup-cluster.yml (cluster key, SSH trust, environment check, all-pairs SSH check);
# 4. generates a small labelled video dataset (shapes moving left/right/up/down) and stages it on both nodes;
# 5. trains configs/slowfast_cpu_demo.yaml with launch-training.yml (DDP over gloo, one process per node);
# 6. prints the final accuracy and where the checkpoint and the plots are.
# A second run reuses what exists: the cluster, keys, environment and dataset are kept, and the launch resumes the
# job "slowfast_cpu_demo" from its last checkpoint (a finished job finishes at once). Remove the demo with
#   ansible-playbook playbooks/local-cluster.yml -e cluster_name=demo -e state=absent
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
JOB=slowfast_cpu_demo
DATA=demo-data/vidcluster-demo
INVENTORY=.local-cluster/demo/inventory.yml
step() { printf '\n==== %s\n' "$*"; }

step "1/6 Installing what is missing (Debian packages, .venv)"
bash scripts/bootstrap.sh
export PATH="$ROOT/.venv/bin:$PATH" ANSIBLE_FORCE_COLOR="${ANSIBLE_FORCE_COLOR:-1}"

step "2/6 Making the local 2-node cluster 'demo'"
ansible-playbook playbooks/local-cluster.yml -e nodes=2 -e cluster_name=demo -e local_cluster_default_inventory=true

# The local hosts come with this machine's .venv mounted read-only at /opt/vidcluster/venv, like an NFS-shared
# environment on a real cluster: setup-cluster.yml finds the pinned versions there and only verifies and compares.

step "3/6 Setting the cluster up (keys, trust, environment, SSH check)"
ansible-playbook -i "$INVENTORY" setup-cluster.yml

step "4/6 Generating the video dataset and staging it on every node"
python -m trainer make-dataset "$DATA" --classes left right up down --train-per-class 16 --val-per-class 8
ansible-playbook -i "$INVENTORY" playbooks/stage-data.yml -e "src=$DATA" -e dest=data/vidcluster-demo

step "5/6 Training SlowFast on 2 nodes (launch-training.yml -e config=$JOB)"
# One thread per process and short polls: both nodes share this machine's cores, and the run is short.
ansible-playbook -i "$INVENTORY" launch-training.yml -e "config=$JOB" \
  -e ddp_config_omp_num_threads=1 -e ddp_launch_poll_seconds=5

step "6/6 Result"
python - "$ROOT/runs/$JOB" "$ROOT/.local-cluster/demo/nodes/0/home" <<'PY'
import json, sys
from pathlib import Path

import yaml

results, node0_home = Path(sys.argv[1]), Path(sys.argv[2])  # node0's home, as this machine sees it
records = [json.loads(line) for line in (results / "metrics.jsonl").read_text().splitlines() if line.strip()]
last = [record for record in records if "epoch" in record][-1]  # (restart records have no epoch)
status = json.loads((results / "status.json").read_text())
config = yaml.safe_load((results / "nodes" / "node0.yaml").read_text())
ckpt_dir = Path(config["CONFIG"]["LOG"]["BASE_PATH"]) / config["CONFIG"]["LOG"]["EXP_NAME"] / "checkpoints"
local = node0_home / ckpt_dir.relative_to(ckpt_dir.parents[len(ckpt_dir.parents) - 3])  # strip /home/<user>
names = ", ".join(sorted(p.name for p in local.glob("*.pth")))
print(f"Final validation accuracy (epoch {last['epoch']}): top-1 {last['val_top1']:.1f}% over 4 classes "
      f"(chance 25%), val loss {last['val_loss']:.3f}; trained by {status['world_size']} processes on 2 nodes.")
print(f"Checkpoints: node0:{ckpt_dir}/ ({names})")
print(f"  from this machine: {local}/")
print(f"Plots and metrics: {results}/curves.png, {results}/metrics.jsonl, {results}/log.txt")
PY
