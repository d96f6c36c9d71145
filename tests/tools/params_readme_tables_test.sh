#!/usr/bin/env bash
# The README parameter tables are what this build's bagua-params prints: every
# <!-- bagua-params LIBRARY --> block of every README must equal `bagua-params --markdown LIBRARY`;
# a stale one fails, naming the README and its first differing line (fix: ./bagua docs).
# Then the check itself: a copy of a README with one table row changed must be reported with
# that README's name and that line.
# usage: params_readme_tables_test.sh PYTHON3 READMETABLES_PY BAGUA_PARAMS SOURCE_ROOT
set -euo pipefail
python="$1"; script="$2"; params="$3"; root="$4"

"$python" "$script" --params "$params" --root "$root" --check

readme="$(grep -rl --include=README.md --exclude-dir='build*' --exclude-dir='.*' \
  '^<!-- bagua-params ' "$root" | sort | head -1)"
if [ -z "$readme" ]; then
  echo "FAIL: no README under $root holds a bagua-params block"
  exit 1
fi
rel="${readme#"$root"/}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/$(dirname "$rel")"
cp "$readme" "$tmp/$rel"
# The block's first table row: the marker, the header, the separator, then the row.
marker="$(grep -n '^<!-- bagua-params ' "$tmp/$rel" | head -1 | cut -d: -f1)"
row=$((marker + 3))
sed -i "${row}s/|[^|]*|$/| changed by hand |/" "$tmp/$rel"
rc=0
out="$("$python" "$script" --params "$params" --root "$tmp" --check)" || rc=$?
if [ "$rc" -eq 0 ] || ! grep -q "^$rel:$row: " <<<"$out"; then
  echo "FAIL: a hand-edited row in $rel line $row was not reported as $rel:$row (exit $rc):"
  echo "$out"
  exit 1
fi
echo "ok: stale table reported as: $(head -1 <<<"$out")"
