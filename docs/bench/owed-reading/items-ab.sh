#!/usr/bin/env bash
# The benchmark's 8 items with the code before (OLD, a git revision, from a worktree) and after (the working
# tree), in turn, twice: a run alone weighs the draft's first reading of the prompt too (AutoGamma.owe).
#   bash docs/bench/owed-reading/items-ab.sh OLD OUT
set -euo pipefail
old=$1 out=$2
py=${PYTHON:-python}
here=$(git rev-parse --show-toplevel)
wt=$(mktemp -d)/old
git worktree add --detach "$wt" "$old" >/dev/null
mkdir -p "$out"
for round in 1 2; do
  for arm in old new; do
    dir=$here; [ $arm = old ] && dir=$wt
    (cd "$dir" && "$py" -m csd bench --dataset humaneval:4,gsm8k:4 --methods ar,sd,csd --max-new-tokens 128 \
      --no-db --out "$out/$arm$round" > "$out/$arm$round.log" 2>&1)
    echo "$arm$round done $(date -u +%T)"
  done
done
git worktree remove --force "$wt"
