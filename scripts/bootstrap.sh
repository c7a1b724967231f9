#!/usr/bin/env bash
# Install what this repository needs on a Debian machine (run as root): system packages and the
# project virtualenv in .venv. Idempotent: packages already present and an up-to-date venv are kept.
#   bash scripts/bootstrap.sh         # runtime: demo, playbooks, trainer
#   bash scripts/bootstrap.sh --dev   # plus test and lint tools
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
# The installer of the venv's requirements (installed by pip first).
UV_VERSION=0.13.9

# openssh-server/iproute2/util-linux: the local test cluster (netns hosts with their own sshd);
# ffmpeg: synthetic H.264 videos, the tests' HEVC/VP9/AV1 videos (Debian's build has libx265, libvpx
# and libaom) and the FFmpeg shared libraries torchcodec loads; python3-venv: Debian's interpreter,
# which the cluster's non-root login user can execute (unlike a Python under /root); rsync: playbooks/stage-data.yml
# copies datasets with it (the local test nodes run this machine's binaries); nftables, iptables, sudo: the host firewall
# of setup-cluster.yml -e firewall=true on the local test nodes (either tool, as a Debian node has it; sudo for become,
# granted only inside the nodes made with local-cluster.yml -e sudo=true), and the cluster tests' rule that closes a
# test node's ports in its namespace (tests/cluster/conftest.py: closed_ports); slurm-client: scontrol, with which a
# trainer under a plain srun finds its rank-0 node; slurmctld, slurmd, munge: the local Slurm cluster
# (playbooks/local-cluster.yml -e slurm=true; their services are not started: the playbook runs its own daemons).
APT_PACKAGES=(openssh-server openssh-client ffmpeg iproute2 util-linux procps python3 python3-venv ca-certificates
  rsync nftables iptables sudo slurm-client slurmctld slurmd munge)
# chromium (--dev): the docs site's screenshots, headless (scripts/screenshot_docs.py)
[ "${1:-}" = "--dev" ] && APT_PACKAGES+=(chromium)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "bootstrap: installing Debian packages: ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

req_files=("$ROOT/requirements.txt" "$ROOT/requirements-node.txt")
[ "${1:-}" = "--dev" ] && req_files+=("$ROOT/requirements-dev.txt" "$ROOT/requirements-reference.txt")
want=$(cat "${req_files[@]}" | sha256sum | cut -d' ' -f1)
stamp="$VENV/.requirements-${#req_files[@]}.sha256"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "bootstrap: installing Python requirements into $VENV (torch is large: a few minutes)"
  /usr/bin/python3 -m venv "$VENV"
  pip_args=()
  for f in "${req_files[@]}"; do [[ "$f" == *-reference.txt || "$f" == *-node.txt ]] || pip_args+=(-r "$f"); done
  # uv installs the requirements (torch and its CUDA libraries are about 4 GB) in half of pip's time; pip installs
  # uv, and hands it its own settings (scripts/uv_settings.py: uv reads no pip configuration). Compiled as pip
  # compiles them: a process that cannot write the venv (the local test nodes' user, a read-only mount) would
  # otherwise compile every module it imports, every time. (The filter hides a harmless warning some pip
  # configurations print once per package.)
  "$VENV/bin/pip" install -q --disable-pip-version-check "uv==$UV_VERSION" 2> >(grep -v "is ignored: it is neither" >&2)
  uv_settings=$("$VENV/bin/python" "$ROOT/scripts/uv_settings.py" "$VENV/bin/pip")
  mapfile -t uv_env <<< "$uv_settings"
  uv=(env "${uv_env[@]}" "$VENV/bin/uv" pip install -q --compile-bytecode --python "$VENV/bin/python")
  "${uv[@]}" "${pip_args[@]}"
  # the reference implementations of the weights tests, without their dependencies (they would replace torch)
  [ "${1:-}" = "--dev" ] && "${uv[@]}" --no-deps -r "$ROOT/requirements-reference.txt"
  "$VENV/bin/python" -c "import torch, torchvision, decord, torchcodec, ansible, paramiko, yaml, pydantic"
  echo "$want" > "$stamp"
fi
# The repository's own Python compiled too, for the same reason: Ansible loads the roles' plugins afresh in every
# process it forks for a task (about a hundred per launch), and where nothing may write bytecode (an image that sets
# PYTHONDONTWRITEBYTECODE, as this project's CI machines do) each of them would compile the plugins again. Files
# already compiled are skipped.
"$VENV/bin/python" -m compileall -q -j 0 "$ROOT/trainer" "$ROOT/roles" "$ROOT/collections" "$ROOT/playbooks" \
  "$ROOT/scripts" >/dev/null
