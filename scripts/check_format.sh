#!/usr/bin/env bash
# Fails when a C/C++ file of ours differs from what clang-format makes of it
# (.clang-format at the root). `scripts/check_format.sh --fix` rewrites them.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.c' '*.cc' '*.h' | grep -v '^bench/c10d_compat/')
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
else
  clang-format --dry-run -Werror "${files[@]}"
  echo "format: ${#files[@]} files follow .clang-format"
fi
