#!/usr/bin/env bash
# Build envs/NAME/.venv from envs/NAME/requirements.txt, only when the requirements changed.
set -euo pipefail
name=$1
python=${2:-python3.11}
dir=$(cd "$(dirname "$0")" && pwd)/$name
req=$dir/requirements.txt
venv=$dir/.venv
[ -f "$req" ] || { echo "no such scorer env: $name ($req missing)" >&2; exit 2; }
# An env that installs this project (a `-e ../..` line: trainer envs) is rebuilt when pyproject.toml changes.
project=/dev/null
grep -q '^-e ' "$req" && project=$dir/../../pyproject.toml
want=$(cat "$req" "$project" | sha256sum | cut -d' ' -f1)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" = "$want" ]; then
    echo "env-$name: up to date"
    exit 0
fi
echo "env-$name: building $venv"
rm -rf "$venv"
"$python" -m venv "$venv"
# pipefail: a failed install fails the build (grep only drops pip's noise) and no stamp is written.
# From the env's folder, so that a relative path in the requirements means the same from anywhere.
(cd "$dir" && "$venv/bin/python" -m pip install -q --no-input -r "$req") 2>&1 | { grep -v "^WARNING: Location" || true; }
"$venv/bin/python" -m pip check
echo "$want" > "$venv/.requirements.sha256"
