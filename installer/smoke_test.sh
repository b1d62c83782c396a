#!/usr/bin/env bash
# Start a built llamadesk executable headless and check that it serves (installer/smoke_test.py says what).
# Usage: installer/smoke_test.sh PATH/TO/llamadesk [--models DIR] [-- MORE LLAMADESK FLAGS]
set -euo pipefail
exec "${PYTHON:-python3}" "$(dirname "$0")/smoke_test.py" "$@"
