#!/usr/bin/env bash
# The GPU check of the synthetic benchmark (random weights, real architectures), as run on a
# lent GPU machine that has torch and transformers but no model files and no network:
#   bash bench/gpu.sh OUT_DIR [DEVICE]
# Steps (STEPS picks a subset): tiny (seconds: does the static path run there at all), s7 and s15 (the
# static path, csd.static: 0.5B -> 7B and 0.5B -> 1.5B at gamma 6, acceptance 0.8), graphs
# (tests/test_static.py on the device: captured graphs, plain and compiled, write the eager path's
# tokens). The default takes about five minutes (at most 470 s), so that a lent machine has time for a second
# call: STEPS="s7c s15c" (the same on --engine compiled: torch.compile fuses each pass before the
# capture; minutes of compiling at load) or s15eager (the eager path on s15's settings) or s15auto.
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
step() {   # name, time limit in s, then the synthetic benchmark's options
  local name=$1 limit=$2; shift 2
  echo "== $name: $*" | tee -a "$log"
  timeout "$limit" $py -m csd.bench.synthetic --device "$dev" --out "$out/$name" "$@" 2>&1 | tee -a "$log" | tail -n 25
  echo "== $name: exit ${PIPESTATUS[0]}" | tee -a "$log"
}
steps=${STEPS:-tiny s7 s15 graphs}   # the first call; a second one: STEPS="s7c s15c"
rep=${REPEATS:-3}                       # timed runs per counted run; the fastest counts (clocks follow the load)
for s in $steps; do
  case $s in
    tiny) step tiny "${TINY_S:-60}" --synthetic-config tiny --limit 2 --max-new-tokens 32 --engine static
          rm -rf "$out/tiny" ;;        # a smoke test: its figures mean nothing
    s15) step s15 "${S15_S:-120}" --synthetic-config 1.5b --limit 3 --max-new-tokens 128 --rehearsals 4 \
              --repeats "$rep" --engine static ;;
    s7) step s7 "${S7_S:-200}" --synthetic-config 7b --limit "${S7_LIMIT:-3}" --max-new-tokens 128 --rehearsals 4 \
             --repeats "$rep" --engine static ;;
    s7c) step s7c "${S7C_S:-330}" --synthetic-config 7b --limit "${S7_LIMIT:-3}" --max-new-tokens 128 --rehearsals 4 \
              --repeats "$rep" --engine compiled ;;
    s15c) step s15c "${S15C_S:-240}" --synthetic-config 1.5b --limit 3 --max-new-tokens 128 --rehearsals 4 \
               --repeats "$rep" --engine compiled ;;
    s15eager) step s15eager "${S15EAGER_S:-110}" --synthetic-config 1.5b --limit 2 --max-new-tokens 128 \
                   --rehearsals 4 --repeats 1 --engine eager ;;
    s15auto) step s15auto "${S15AUTO_S:-110}" --synthetic-config 1.5b --limit 3 --max-new-tokens 128 --gamma auto \
                  --rehearsals 4 --repeats "$rep" --engine static ;;
    graphs) echo "== graphs: tests/test_static.py" | tee -a "$log"
            timeout "${GRAPHS_S:-90}" $py -m pytest -q -p no:cacheprovider tests/test_static.py 2>&1 | tee -a "$log" | tail -n 5
            echo "== graphs: exit ${PIPESTATUS[0]}" | tee -a "$log" ;;
    *) echo "unknown step $s" >&2; exit 2 ;;
  esac
done
date -u | tee -a "$log"
