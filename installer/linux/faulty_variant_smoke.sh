#!/usr/bin/env bash
# The AMX trap, on any x86_64 machine: a copy of the bundle (hard links) whose sapphirerapids CPU variant (the one
# with ggml's AMX kernels) is replaced by a stand-in that scores itself best here and dies with SIGILL when
# loaded, as the AMX kernel does on a VM that advertises AMX. The bundle must probe it, exclude it, say so in
# its log and hardware line, remember the verdict, and serve everything on the next variant (smoke test).
# Needs a C compiler (the build machine's; the bundle never does).
# Usage: installer/linux/faulty_variant_smoke.sh dist/llamadesk --models DIR
set -euo pipefail
BUNDLE=$(cd "${1:?usage: faulty_variant_smoke.sh BUNDLE_DIR --models DIR}" && pwd)
shift
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cp -al "$BUNDLE" "$WORK/llamadesk"
LIB=$(dirname "$(find "$WORK/llamadesk" -name 'libggml-cpu-sapphirerapids.so' | head -1)")
[ "$LIB" != . ] || { echo "faulty_variant_smoke.sh: the bundle carries no sapphirerapids variant" >&2; exit 3; }
rm "$LIB/libggml-cpu-sapphirerapids.so"  # a hard link: the bundle's own file stays as it is
printf '%s\n' 'int ggml_backend_score(void) { return 1 << 20; }' \
  'void *ggml_backend_init(void) { __builtin_trap(); return 0; }' > "$WORK/faulty.c"
"${CC:-cc}" -shared -fPIC -O1 -o "$LIB/libggml-cpu-sapphirerapids.so" "$WORK/faulty.c"
echo "with a sapphirerapids variant that claims to be the best and dies with SIGILL"
"${PYTHON:-python3}" "$(dirname "$0")/../smoke_test.py" "$WORK/llamadesk/llamadesk" \
  --expect-excluded "sapphirerapids: killed by SIGILL" "$@"
