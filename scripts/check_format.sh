#!/usr/bin/env bash
# Checks every C++/CUDA source (*.h *.hpp *.cpp *.cu *.cuh) that git tracks, or would track (new
# files not ignored), against the repository's .clang-format and lists the files that differ;
# exits non-zero if any does.
#   scripts/check_format.sh          check (clang-format --dry-run -Werror)
#   scripts/check_format.sh --fix    rewrite the files in place (clang-format -i)
# CLANG_FORMAT picks the binary (default: clang-format on PATH; CI uses Debian's, version 14).
# Other clang-format versions may lay out a few constructs differently.
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT=${CLANG_FORMAT:-clang-format}
fix=0
case "${1:-}" in
  --fix) fix=1 ;;
  "") ;;
  *) echo "usage: scripts/check_format.sh [--fix]" >&2; exit 2 ;;
esac
if ! command -v "$CLANG_FORMAT" >/dev/null 2>&1; then
  echo "check_format: $CLANG_FORMAT not found (Debian: apt-get install clang-format)" >&2
  exit 2
fi

files=()
while IFS= read -r -d '' file; do
  # A file deleted in the work tree but not yet in the index is skipped.
  [[ -f $file ]] && files+=("$file")
done < <(git ls-files -z --cached --others --exclude-standard -- \
           '*.h' '*.hpp' '*.cpp' '*.cu' '*.cuh' | sort -zu)

if ((fix)); then
  "$CLANG_FORMAT" -i --style=file "${files[@]}"
  echo "check_format: formatted ${#files[@]} files with $("$CLANG_FORMAT" --version)"
  exit 0
fi

bad=()
for file in "${files[@]}"; do
  if ! "$CLANG_FORMAT" --dry-run -Werror --style=file "$file" >/dev/null 2>&1; then
    bad+=("$file")
  fi
done
if ((${#bad[@]})); then
  echo "check_format: ${#bad[@]} of ${#files[@]} files are not formatted ($("$CLANG_FORMAT" --version)):"
  for file in "${bad[@]}"; do
    echo "  $file"
    "$CLANG_FORMAT" --style=file "$file" | diff -u "$file" - | sed -n '3,12s/^/    /p' || true
  done
  echo "Run scripts/check_format.sh --fix to format them."
  exit 1
fi
echo "check_format: ${#files[@]} files formatted as .clang-format asks"
