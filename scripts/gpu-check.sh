#!/usr/bin/env bash
# The GPU check, for a short device window: the node's environment report and the readiness check's bf16 matmul, the
# GPU tests (tests/trainer/test_gpu.py: nccl training, AMP, SyncBatchNorm, crops and decoding on the GPU,
# channels_last, torch.compile), a restart in place over nccl where two GPUs are visible, and bench/gpu_step.py
# (SlowFast 8x8 step time, data-wait share and peak memory with the levers off, on and compiled) on the GPUs it sees,
# then the machine's facts and one table of what held, what was measured and what was not checked
# (bench/gpu_check.py): printed, and written to OUT/gpu-check.md with the logs and raw results. Each test's outcome and
# each bench setting is written as it ends, so a stage that runs out of time keeps what it got.
#   bash scripts/gpu-check.sh OUT
# Every stage runs under timeout(1) with its budget below (BUDGET_S, seconds; KILL_AFTER_S more for a stage that
# ignores SIGTERM): all of them together stay within 9 minutes on one GPU, which tests/test_gpu_check.py asserts by
# reading this file. GPU_CHECK_TESTS_S and GPU_CHECK_BENCH_S change the two longest.
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
KILL_AFTER_S=5
# The budget of each stage, seconds: the bundle's Python and its torch, the bundle's install, torch's GPU count, the
# node's report and matmul, the GPU tests, the restart in place on two GPUs, the bench, the table.
declare -A BUDGET_S=([python]=30 [install]=25 [gpus]=30 [node]=45 [tests]=160 [inplace]=90 [bench]=90 [table]=30)
BUDGET_S[tests]=${GPU_CHECK_TESTS_S:-${BUDGET_S[tests]}}
BUDGET_S[bench]=${GPU_CHECK_BENCH_S:-${BUDGET_S[bench]}}
BENCH_STEPS=10
# The tests of the node and in-place stages; the tests stage runs the rest of test_gpu.py.
GPU_TESTS=tests/trainer/test_gpu.py
NODE_TESTS=("$GPU_TESTS::test_the_nodes_environment_report" "$GPU_TESTS::test_the_readiness_checks_bf16_matmul")
INPLACE_TESTS=("$GPU_TESTS::test_restart_in_place_over_nccl")

die() { echo "gpu-check: $*" >&2; exit 2; }
# staged NAME COMMAND...: COMMAND under stage NAME's budget.
staged() { local name=$1; shift; timeout --kill-after="$KILL_AFTER_S" "${BUDGET_S[$name]}" "$@"; }
# GPU tests under stage NAME's budget, each outcome written to OUT/tests.jsonl as it ends.
gpu_tests() {
  local name=$1; shift
  echo "gpu-check: $name stage (at most ${BUDGET_S[$name]} s; log $OUT/$name.log)"
  staged "$name" "$PYTHON" -m pytest -p no:cacheprovider -n 0 -rs -p tests.trainer._gpu_results \
    --gpu-results "$OUT/tests.jsonl" "$@" > "$OUT/$name.log" 2>&1
}
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
  have=$(staged python "$PYTHON" -c 'import sys, torch, torchvision; print("%d.%d" % sys.version_info[:2])') ||
    die "$PYTHON does not run, or has no torch and torchvision of its own"
  made_for=$(cat "$BUNDLE/python-version")
  [ "$have" = "$made_for" ] || die "$BUNDLE was made for Python $made_for, $PYTHON is $have:" \
    "run scripts/gpu-bundle.sh --python $have"
  SITE=$(mktemp -d "${TMPDIR:-/tmp}/vidcluster-gpu-check.XXXXXX")
  trap 'rm -rf "$SITE"' EXIT
  staged install "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --target "$SITE" \
    "$BUNDLE"/wheels/*.whl > "$OUT/install.log" 2>&1 || die "installing $BUNDLE/wheels failed: see $OUT/install.log"
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  export VIDCLUSTER_TEST_VIDEOS="$BUNDLE/videos"  # tests/trainer/prepared_videos.py
  bench_videos=(--videos "$BUNDLE/videos/kinetics_like")
  echo "gpu-check: $PYTHON with its own torch, and the wheels and videos of $BUNDLE"
fi

cd "$ROOT" || exit 2
rm -f "$OUT/tests.jsonl" "$OUT/gpu_step.json" "$OUT/gpu-check.md"  # a result of an earlier run is not this one's
gpus=$(staged gpus "$PYTHON" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' \
  2>/dev/null) || die "$PYTHON cannot import torch"
[ "$gpus" -gt 0 ] || echo "gpu-check: no GPU is visible here: every check will be listed as not checked"
gpu_tests node "${NODE_TESTS[@]}"
node=$?
deselect=()
for test in "${NODE_TESTS[@]}" "${INPLACE_TESTS[@]}"; do deselect+=(--deselect "$test"); done
gpu_tests tests "$GPU_TESTS" "${deselect[@]}"
tests=$?
gpu_tests inplace "${INPLACE_TESTS[@]}"
inplace=$?
echo "gpu-check: bench/gpu_step.py (at most ${BUDGET_S[bench]} s; log $OUT/bench.log)"
staged bench "$PYTHON" -m bench.gpu_step --steps "$BENCH_STEPS" --json "$OUT/gpu_step.json" "${bench_videos[@]}" \
  > "$OUT/bench.log" 2>&1
bench=$?
# bench.gpu_check knows two stages: the worst of the three pytest runs is the tests stage's status.
worst=$tests
for status in $node $inplace; do
  if [ "$status" -eq 124 ] || { [ "$worst" -ne 124 ] && [ "$status" -gt "$worst" ]; }; then worst=$status; fi
done
staged table "$PYTHON" -m bench.gpu_check "$OUT" --stage "tests=$worst" --stage "bench=$bench"
