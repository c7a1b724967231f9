#!/usr/bin/env bash
# The GPU check, for a short device window: the GPU tests (tests/trainer/test_gpu.py: nccl training, AMP,
# SyncBatchNorm, crops and decoding on the GPU, channels_last, torch.compile) and bench/gpu_step.py (SlowFast 8x8
# step time, data-wait share and peak memory with the levers off, on and compiled) on the GPUs it sees, each stage
# under a time limit (tests 210 s, bench 180 s: under 8 minutes in all with the set-up; GPU_CHECK_TESTS_S and
# GPU_CHECK_BENCH_S change them), then the machine's facts and one table of what held, what was measured and what was
# not checked (bench/gpu_check.py): printed, and written to OUT/gpu-check.md with the logs and raw results. Each test's
# outcome and each bench setting is written as it ends, so a stage that runs out of time keeps what it got.
#   bash scripts/gpu-check.sh OUT
# Where:
#   - a GPU node set up as the README says (scripts/bootstrap.sh --dev): the repository's .venv;
#   - a bare GPU image with its own Python, torch and torchvision, and no package registry: the wheels and videos of
#     .gpu-bundle/ (scripts/gpu-bundle.sh, run beforehand elsewhere), put beside the image's packages for this run
#     only (a temporary folder on PYTHONPATH; nothing of the image changes). GPU_CHECK_PYTHON names its Python
#     (default python3; setting it also chooses this way where a .venv exists).
# Exit status: 0 when nothing failed (a check that could not run is listed, not failed), 1 when something failed or
# ran out of time, 2 when the check could not start, 3 when no GPU is visible (every row then says "not checked").
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TESTS_LIMIT_S=${GPU_CHECK_TESTS_S:-210}
BENCH_LIMIT_S=${GPU_CHECK_BENCH_S:-180}
BENCH_STEPS=15

die() { echo "gpu-check: $*" >&2; exit 2; }
[ $# -eq 1 ] || die "usage: $0 OUT (a folder for the table, the logs and the raw results)"
mkdir -p "$1" || die "cannot make $1"
OUT=$(cd "$1" && pwd)

bench_videos=()
if [ -z "${GPU_CHECK_PYTHON:-}" ] && [ -x "$ROOT/.venv/bin/python" ]; then
  PYTHON="$ROOT/.venv/bin/python"
  echo "gpu-check: the repository's environment ($PYTHON)"
else
  PYTHON=${GPU_CHECK_PYTHON:-python3}
  BUNDLE="$ROOT/.gpu-bundle"
  [ -d "$BUNDLE/wheels" ] || die "no .venv and no $BUNDLE: run scripts/bootstrap.sh --dev here, or" \
    "scripts/gpu-bundle.sh where a package registry is reachable and copy .gpu-bundle/ here"
  have=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])') || die "$PYTHON does not run"
  made_for=$(cat "$BUNDLE/python-version")
  [ "$have" = "$made_for" ] || die "$BUNDLE was made for Python $made_for, $PYTHON is $have:" \
    "run scripts/gpu-bundle.sh --python $have"
  "$PYTHON" -c 'import torch, torchvision' || die "$PYTHON has no torch and torchvision of its own"
  SITE=$(mktemp -d "${TMPDIR:-/tmp}/vidcluster-gpu-check.XXXXXX")
  trap 'rm -rf "$SITE"' EXIT
  "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --target "$SITE" \
    "$BUNDLE"/wheels/*.whl > "$OUT/install.log" 2>&1 || die "installing $BUNDLE/wheels failed: see $OUT/install.log"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  export VIDCLUSTER_TEST_VIDEOS="$BUNDLE/videos"  # tests/trainer/prepared_videos.py
  bench_videos=(--videos "$BUNDLE/videos/kinetics_like")
  echo "gpu-check: $PYTHON with its own torch, and the wheels and videos of $BUNDLE"
fi

cd "$ROOT" || exit 2
rm -f "$OUT/tests.jsonl" "$OUT/gpu_step.json" "$OUT/gpu-check.md"  # a result of an earlier run is not this one's
gpus=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null) ||
  die "$PYTHON cannot import torch"
[ "$gpus" -gt 0 ] || echo "gpu-check: no GPU is visible here: every check will be listed as not checked"
echo "gpu-check: GPU tests (at most $TESTS_LIMIT_S s; log $OUT/tests.log)"
timeout --kill-after=10 "$TESTS_LIMIT_S" "$PYTHON" -m pytest -p no:cacheprovider -n 0 -rs \
  -p tests.trainer._gpu_results --gpu-results "$OUT/tests.jsonl" tests/trainer/test_gpu.py > "$OUT/tests.log" 2>&1
tests=$?
echo "gpu-check: bench/gpu_step.py (at most $BENCH_LIMIT_S s; log $OUT/bench.log)"
timeout --kill-after=10 "$BENCH_LIMIT_S" "$PYTHON" -m bench.gpu_step --steps "$BENCH_STEPS" \
  --json "$OUT/gpu_step.json" "${bench_videos[@]}" > "$OUT/bench.log" 2>&1
bench=$?
"$PYTHON" -m bench.gpu_check "$OUT" --stage "tests=$tests" --stage "bench=$bench"
