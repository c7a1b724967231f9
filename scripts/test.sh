#!/usr/bin/env bash
# The test command: installs what the tests need, then runs lint and the whole suite.
# Needs root (the cluster tests build network-namespace hosts with their own sshd).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$ROOT/scripts/bootstrap.sh" --dev
cd "$ROOT"
exec .venv/bin/python -m pytest "$@"
