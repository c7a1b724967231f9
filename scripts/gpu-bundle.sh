#!/usr/bin/env bash
# What scripts/gpu-check.sh needs on a GPU machine that reaches no package registry: a bare image with its own
# Python, torch and torchvision. Made here, where the registry and ffmpeg are (after scripts/bootstrap.sh --dev):
#   bash scripts/gpu-bundle.sh [--python 3.12] [--torchcodec 0.11.1]
#   bash scripts/gpu-bundle.sh --requirements FILE      # only write the bundle's requirement file (tests resolve it)
# writes .gpu-bundle/ (gitignored, at most 64 MiB, copied to the GPU machine with the repository):
#   wheels/   the pins of requirements-node.txt (a node's packages) for that Python (manylinux x86_64), less what the
#             image brings (torch, torchvision and their numpy, pillow, setuptools) and what the check does not use
#             (paramiko: the SSH check), with the torchcodec release built for the image's torch, and pytest;
#   videos/   the GPU tests' videos and bench/gpu_step.py's (tests/trainer/prepared_videos.py), for a machine
#             without ffmpeg.
# The default image: Python 3.12, torch 2.11, torchvision 0.26; torchcodec 0.11 is the release built for torch 2.11
# (torchcodec's compatibility table; its wheels on PyPI decode on the CPU only).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY_VERSION=3.12
TORCHCODEC=0.11.1
LIMIT_BYTES=$((64 * 1024 * 1024))
# Installed with torch and torchvision (the image has them, at the versions they need): not carried.
IMAGE_HAS=(numpy pillow setuptools)

REQUIREMENTS_ONLY=""
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PY_VERSION=$2; shift 2 ;;
    --torchcodec) TORCHCODEC=$2; shift 2 ;;
    --requirements) REQUIREMENTS_ONLY=$2; shift 2 ;;
    *) echo "usage: $0 [--python X.Y] [--torchcodec VERSION] [--requirements FILE]" >&2; exit 2 ;;
  esac
done

# A node's pins (requirements-node.txt holds packages only: an option line such as -r would not survive the filter),
# less what the image has or the check does not use; the torchcodec built for the image's torch; the test runners.
bundle_requirements() {
  local node="$ROOT/requirements-node.txt" options
  if options=$(grep -E '^\s*-' "$node"); then
    echo "gpu-bundle: $node has option lines the bundle cannot follow: $options" >&2
    return 2
  fi
  grep -v -E '^\s*(#|$)' "$node" | grep -v -E '^(torch|torchvision|torchcodec|paramiko)\b'
  echo "torchcodec==$TORCHCODEC"
  grep -E '^pytest' "$ROOT/requirements-dev.txt"
}
if [ -n "$REQUIREMENTS_ONLY" ]; then
  bundle_requirements > "$REQUIREMENTS_ONLY"
  exit
fi

PYTHON="$ROOT/.venv/bin/python"
[ -x "$PYTHON" ] || { echo "gpu-bundle: no $PYTHON; run scripts/bootstrap.sh --dev first" >&2; exit 2; }
command -v ffmpeg >/dev/null || { echo "gpu-bundle: no ffmpeg to make the videos; run scripts/bootstrap.sh" >&2; exit 2; }

BUNDLE="$ROOT/.gpu-bundle"
rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/wheels"
bundle_requirements > "$BUNDLE/requirements.txt"
abi="cp${PY_VERSION/./}"
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux2010 manylinux1; do
  platforms+=(--platform "${tag}_x86_64")
done
"$PYTHON" -m pip download --quiet --disable-pip-version-check --only-binary=:all: --python-version "$PY_VERSION" \
  --implementation cp --abi "$abi" "${platforms[@]}" -d "$BUNDLE/wheels" -r "$BUNDLE/requirements.txt" \
  2> >(grep -v "is ignored: it is neither" >&2)
for name in "${IMAGE_HAS[@]}"; do
  rm -f "$BUNDLE/wheels/$name"-[0-9]*.whl
done
echo "$PY_VERSION" > "$BUNDLE/python-version"

(cd "$ROOT" && "$PYTHON" -m tests.trainer.prepared_videos "$BUNDLE/videos")

size=$(du -sb "$BUNDLE" | cut -f1)
echo "gpu-bundle: $BUNDLE for Python $PY_VERSION: $(ls "$BUNDLE/wheels" | wc -l) wheels, videos;" \
  "$((size / 1024 / 1024)) MiB of at most $((LIMIT_BYTES / 1024 / 1024))"
if [ "$size" -gt "$LIMIT_BYTES" ]; then
  echo "gpu-bundle: too large to carry to the GPU machine" >&2
  exit 1
fi
