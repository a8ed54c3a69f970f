#!/usr/bin/env bash
# The main job: set up, then `python -m make_inplace` (extra arguments pass through).
set -euo pipefail
cd "$(dirname "$0")/.."
py=$(bash scripts/setup.sh | tail -n 1)
exec "$py" -m make_inplace "$@"
