#!/usr/bin/env bash
# The app's runs (cli/app_runs.py) with prepare's profile of the batched pair (target gguf, draft int8) replaced by
# the one taken in a slow spell (docs/bench/avx2-epyc8/native/profile-slow-spell.json), before and after gamma auto
# weighed the draft's first reading of the prompt (AutoGamma.owe): OLD is a git revision, run from a worktree; the
# working tree is NEW. The profile file is put back as it was at the end.
#   bash docs/bench/owed-reading/ab.sh OLD OUT [LLAMA_BENCH]
set -euo pipefail
old=$1 out=$2 lb=${3:-}
py=${PYTHON:-python}
here=$(git rev-parse --show-toplevel)
mkdir -p "$out"
profile=$("$py" - <<'PY'
import json
from csd.fileio import cache_dir
from csd.runtime.profile import engine_revision, machine_name
for f in sorted((cache_dir() / "profiles").glob("costs-*.json")):
    key = json.loads(f.read_text()).get("key", {})
    if (key.get("engine"), key.get("machine"), key.get("representation", {}).get("target"),
            key.get("representation", {}).get("draft")) == (engine_revision(), machine_name("cpu"), "gguf", "int8"):
        print(f)
PY
)
[ "$(echo "$profile" | wc -w)" = 1 ] || { echo "not one profile of the batched pair (run python -m csd prepare): $profile"; exit 1; }
echo "profile of the batched pair: $profile"
cp "$profile" "$out/profile-before.json"
"$py" - "$profile" "$here/docs/bench/avx2-epyc8/native/profile-slow-spell.json" <<'PY'
import json, sys
path, slow = sys.argv[1], json.load(open(sys.argv[2]))
d = json.load(open(path))
for k in ("verify_ms", "draft_ms", "pass_overhead_ms", "draft_overhead_ms"):
    d[k] = slow[k]
json.dump(d, open(path, "w"), indent=1)
PY
trap 'cp "$out/profile-before.json" "$profile"' EXIT
wt=$(mktemp -d)/old
git worktree add --detach "$wt" "$old" >/dev/null
for arm in old new; do
  dir=$here; [ $arm = old ] && dir=$wt
  (cd "$dir" && "$py" -m cli.app_runs --out "$out/$arm" ${lb:+--llama-bench "$lb"}) 2>&1 | tail -3
done
git worktree remove --force "$wt"
