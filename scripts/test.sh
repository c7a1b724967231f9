#!/usr/bin/env bash
# The test command: installs what the tests need, then runs lint and the suite's main lane (about 16 minutes here).
#   bash scripts/test.sh            # the main lane: everything but the slow scenarios
#   bash scripts/test.sh --slow     # the slow lane: whole jobs on clusters of their own, and their failures (.ci/run runs
#                                   # it after the main lane)
#   bash scripts/test.sh --all      # both
# Extra arguments go to pytest (e.g. a test file). Needs root (the cluster tests build network-namespace hosts with
# their own sshd).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lane=(-m "not slow")
case "${1:-}" in
  --slow) lane=(-m slow); shift ;;
  --all) lane=(); shift ;;
esac
bash "$ROOT/scripts/bootstrap.sh" --dev
cd "$ROOT"
exec .venv/bin/python -m pytest "${lane[@]}" "$@"
