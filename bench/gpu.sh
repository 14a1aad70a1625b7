#!/usr/bin/env bash
# The GPU check of the synthetic benchmark (random weights, real architectures), as run on a
# lent GPU machine that has torch and transformers but no model files and no network:
#   bash bench/gpu.sh OUT_DIR [DEVICE]
# Steps (STEPS picks a subset): profile (kernels a pass: a draft step, a draft block, 1- and 7-token
# verify passes of both pairs, through csd.bench.synthetic.kernel_profile), s15 and s7 (the static
# path, csd.runtime.static: 0.5B -> 1.5B and 0.5B -> 7B at gamma 6, acceptance 0.8), s15auto and s7auto (the
# same with gamma auto), graphs (tests/test_static.py on the device: captured graphs, plain and
# compiled, write the eager path's tokens). The default call stops starting steps once TOTAL_S
# (300 s) is spent and cuts each step's limit to what is left, so it fits five minutes with time for
# a second call: STEPS="s7c s15c" (the same on --engine compiled: minutes of compiling at load),
# s15eager (the eager path on s15's settings), tiny (a CPU-sized smoke test).
# Each step has its own time limit and the next runs even if one fails; results land in OUT_DIR/<step>/.
set -u
out=${1:?usage: bash bench/gpu.sh OUT_DIR [DEVICE]}
dev=${2:-cuda}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
log="$out/log.txt"
{
  date -u; nvidia-smi -L 2>/dev/null || true
  $py -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__,
'device', torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
} 2>&1 | tee -a "$log"
total=${TOTAL_S:-$([ -z "${STEPS:-}" ] && echo 300 || echo 86400)}; t0=$SECONDS   # the default call: 5 minutes
left() {   # a step's limit: its own, or what is left of TOTAL_S if less (0: no time left)
  local l=$(( total - (SECONDS - t0) )); [ "$l" -lt 0 ] && l=0
  [ "$1" -lt "$l" ] && echo "$1" || echo "$l"
}
run_limited() {   # name, limit, command...
  local name=$1 limit; limit=$(left "$2"); shift 2
  if [ "$limit" -lt 10 ]; then echo "== $name: skipped, TOTAL_S=$total spent" | tee -a "$log"; return; fi
  echo "== $name (limit $limit s): $*" | tee -a "$log"
  timeout "$limit" "$@" 2>&1 | tee -a "$log" | tail -n 25
  echo "== $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s in all" | tee -a "$log"
}
step() {   # name, time limit in s, then the synthetic benchmark's options
  local name=$1 limit=$2; shift 2
  run_limited "$name" "$limit" $py -m csd.bench.synthetic --device "$dev" --out "$out/$name" "$@"
}
steps=${STEPS:-profile s15 s15auto s7 s7auto graphs}   # the first call; a second one: STEPS="s7c s15c"
rep=${REPEATS:-2}                       # timed runs per counted run; the fastest counts (clocks follow the load)
for s in $steps; do
  case $s in
    profile) run_limited profile "${PROFILE_S:-60}" $py -m csd.bench.synthetic.kernel_profile --device "$dev" \
                  --pairs "${PROFILE_PAIRS:-1.5b,7b}" --out "$out/profile" ;;
    tiny) step tiny "${TINY_S:-60}" --synthetic-config tiny --limit 2 --max-new-tokens 32 --engine static
          rm -rf "$out/tiny" ;;        # a smoke test: its figures mean nothing
    s15) step s15 "${S15_S:-90}" --synthetic-config 1.5b --limit 3 --max-new-tokens 128 --rehearsals 4 \
              --repeats "$rep" --engine static ;;
    s7) step s7 "${S7_S:-120}" --synthetic-config 7b --limit "${S7_LIMIT:-3}" --max-new-tokens 128 --rehearsals 4 \
             --repeats "$rep" --engine static ;;
    s7auto) step s7auto "${S7AUTO_S:-120}" --synthetic-config 7b --limit "${S7_LIMIT:-3}" --max-new-tokens 128 \
                 --gamma auto --rehearsals 4 --repeats "$rep" --engine static ;;
    s7c) step s7c "${S7C_S:-330}" --synthetic-config 7b --limit "${S7_LIMIT:-3}" --max-new-tokens 128 --rehearsals 4 \
              --repeats "$rep" --engine compiled ;;
    s15c) step s15c "${S15C_S:-240}" --synthetic-config 1.5b --limit 3 --max-new-tokens 128 --rehearsals 4 \
               --repeats "$rep" --engine compiled ;;
    s15eager) step s15eager "${S15EAGER_S:-110}" --synthetic-config 1.5b --limit 2 --max-new-tokens 128 \
                   --rehearsals 4 --repeats 1 --engine eager ;;
    s15auto) step s15auto "${S15AUTO_S:-90}" --synthetic-config 1.5b --limit 3 --max-new-tokens 128 --gamma auto \
                  --rehearsals 4 --repeats "$rep" --engine static ;;
    graphs) run_limited graphs "${GRAPHS_S:-120}" $py -m pytest -q -p no:cacheprovider tests/test_static.py ;;
    *) echo "unknown step $s" >&2; exit 2 ;;
  esac
done
date -u | tee -a "$log"
