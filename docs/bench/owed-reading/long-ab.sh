#!/usr/bin/env bash
# One long prompt (about 1,500 tokens: csd/policy.py's source and a question) and a short one, CSD with the
# defaults and 128 new tokens, the code before (OLD, from a worktree) and after (the working tree), in turn, twice:
# where the draft's first reading of a long prompt costs more than drafting can save, the run now leaves it unread.
#   bash docs/bench/owed-reading/long-ab.sh OLD OUT
set -euo pipefail
old=$1 out=$2
py=${PYTHON:-python}
here=$(git rev-parse --show-toplevel)
wt=$(mktemp -d)/old
git worktree add --detach "$wt" "$old" >/dev/null
mkdir -p "$out"
long="$(git -C "$here" show "$old":csd/policy.py)

What does AutoGamma.more decide, in two sentences?"
short="Write a Python function that returns the n-th Fibonacci number."
for round in 1 2; do
  for arm in old new; do
    dir=$here; [ $arm = old ] && dir=$wt
    for name in long short; do
      prompt=$long; [ $name = short ] && prompt=$short
      (cd "$dir" && "$py" -m csd generate --prompt "$prompt" --method csd --max-new-tokens 128 --json --no-db \
        > "$out/$arm$round-$name.json" 2> "$out/$arm$round-$name.log")
    done
    echo "$arm$round done $(date -u +%T)"
  done
done
git worktree remove --force "$wt"
"$py" - "$out" <<'PY'
import json, sys
from pathlib import Path
rows = ["| run | prompt | new tokens | drafted | target passes | prefill_s | wall_s | tok/s |",
        "|---|---|---:|---:|---:|---:|---:|---:|"]
for f in sorted(Path(sys.argv[1]).glob("*.json")):
    d = json.loads(f.read_text())
    m = d["metrics"]
    n = len(d["token_ids"])
    rows.append(f"| {f.stem.split('-')[0]} | {f.stem.split('-')[1]} | {n} | "
                f"{m.get('drafted', '')} | {m['target_forwards']} | {m.get('prefill_s', 0):.2f} | {m['wall_s']:.2f} | "
                f"{n / m['wall_s']:.2f} |")
Path(sys.argv[1], "results.md").write_text("\n".join(rows) + "\n")
print("\n".join(rows))
PY
