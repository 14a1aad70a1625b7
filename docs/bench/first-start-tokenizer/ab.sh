#!/usr/bin/env bash
# The app's first start with an empty cache (bench/cpu.sh's start step), the code before (OLD, a git revision, from
# a worktree) and after (the working tree), in turn, twice: the tokenizer converted from its class
# (csd.runtime.embedded.gguf_tokenizer) instead of after a whole read of the file's metadata.
#   bash docs/bench/first-start-tokenizer/ab.sh OLD OUT
set -euo pipefail
old=$1 out=$2
here=$(git rev-parse --show-toplevel)
wt=$(mktemp -d)/old
git worktree add --detach "$wt" "$old" >/dev/null
mkdir -p "$out"
for round in 1 2; do
  for arm in old new; do
    dir=$here; [ $arm = old ] && dir=$wt
    (cd "$dir" && STEPS=start bash bench/cpu.sh "$out/$arm$round" > /dev/null 2>&1) || echo "$arm$round failed"
    echo "$arm$round: $(head -1 "$out/$arm$round/start/start.txt") ($(date -u +%T))"
  done
done
git worktree remove --force "$wt"
