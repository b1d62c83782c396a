#!/usr/bin/env bash
# The smoke test of a Linux x86_64 bundle as on an older CPU: QEMU user mode (Debian's qemu-user) runs the
# bundle's executable as CPU (a QEMU model: Nehalem has SSE4.2 and no AVX, Haswell AVX2 and no AVX-512), so
# llama.cpp must pick that CPU's variant (installer/smoke_test.py --expect-variant) and every check still pass,
# where a native build of this machine would die with SIGILL. Children the bundle starts (the CPU-variant probe,
# the speech workers) run natively: QEMU user mode does not follow an exec.
# Usage: installer/linux/oldcpu_smoke.sh dist/llamadesk CPU VARIANT --models DIR
#   e.g. installer/linux/oldcpu_smoke.sh dist/llamadesk Nehalem sse42 --models ~/.cache/llamadesk/test-assets
set -euo pipefail
BUNDLE=$(cd "${1:?usage: oldcpu_smoke.sh BUNDLE_DIR CPU VARIANT --models DIR}" && pwd)
CPU=${2:?usage: oldcpu_smoke.sh BUNDLE_DIR CPU VARIANT --models DIR}
VARIANT=${3:?usage: oldcpu_smoke.sh BUNDLE_DIR CPU VARIANT --models DIR}
shift 3
QEMU=${QEMU:-qemu-x86_64}
command -v "$QEMU" >/dev/null || { echo "oldcpu_smoke.sh: $QEMU not found (Debian's qemu-user)" >&2; exit 3; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# PyInstaller's bootloader executes itself once more with LD_LIBRARY_PATH set, and that exec would leave QEMU:
# start the executable as that second process, with the environment the first one gives it.
cat > "$WORK/llamadesk" <<LAUNCHER
#!/bin/sh
exec env _PYI_ARCHIVE_FILE="$BUNDLE/llamadesk" _PYI_PARENT_PROCESS_LEVEL=-1 _PYI_LINUX_PROCESS_NAME=llamadesk \
  LD_LIBRARY_PATH="$BUNDLE/_internal" "$(command -v "$QEMU")" -cpu "$CPU" "$BUNDLE/llamadesk" "\$@"
LAUNCHER
chmod +x "$WORK/llamadesk"
echo "as a $CPU CPU (QEMU user mode): expecting the $VARIANT variant"
"${PYTHON:-python3}" "$(dirname "$0")/../smoke_test.py" "$WORK/llamadesk" --expect-variant "$VARIANT" "$@"
