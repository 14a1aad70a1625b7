#!/usr/bin/env bash
# The CPU engine's tables (issue 52) on the machine at hand, in one call, with nothing else running:
#   bash bench/cpu.sh OUT_DIR [LLAMA_BENCH]
# Steps, in order (STEPS picks a subset):
#   prepare   python -m csd prepare: the embedded pair converted, the target and the draft timed in each
#             representation (int8, gguf; ort4 for the draft), the costs
#   profile   python -m csd.bench.cpu_profile: where a draft step and 1- and 6-token target passes go
#   keep      python -m csd.bench.keep_rate: the draft's keep rate per block position, int8 and ort4
#   bench     python -m csd bench, AR, SD and CSD on ITEMS: the defaults (bench-default), then the int8 target
#             with its activations per pass, the lossy speed flag (bench-pass); each result names its
#             representation and int8 kernels
#   side      python -m csd.bench.llama_side beside llama.cpp (needs LLAMA_BENCH: docs/cpu.md builds it): the
#             defaults, then each target of ALSO_DTYPE (int8,gguf), and their passes timed in turn
#   app       python -m csd.cli.app_runs: the app's models and batcher with its defaults, a CSD run alone and
#             8 at once, beside llama.cpp's plain decoding where LLAMA_BENCH is given (`solo` is the same step)
#   start     the app's first start with an empty cache: seconds to the address, resident and peak memory
#   avx2      (not in the default list) on a CPU with AVX-512, the kernel's AVX2 path as a stand-in for a CPU
#             without it: prepare, side and app again with AVX-512 switched off on both sides (the kernel's AVX2
#             build, PyTorch's AVX2 kernels), beside LLAMA_BENCH_AVX2, a llama-bench built without AVX-512
#             (docs/cpu.md); output in OUT_DIR/avx2
# ITEMS (humaneval:4,gsm8k:4; KEEP_ITEMS for keep: humaneval:8,gsm8k:8) and TOKENS (128) set the items and
# new tokens. Each step's output lands in OUT_DIR/<step>; a failing step is logged and the next one runs.
# Commit a benchmark run's results.json.gz and results.md, not its charts (docs/benchmarks.md). About 40
# minutes on 2 cores with llama.cpp, its build aside (docs/cpu.md, "Beside llama.cpp").
set -u
out=${1:?usage: bash bench/cpu.sh OUT_DIR [LLAMA_BENCH]}
llama=${2:-}
items=${ITEMS:-humaneval:4,gsm8k:4}
tokens=${TOKENS:-128}
py=${PYTHON:-python}
mkdir -p "$out"
out=$(cd "$out" && pwd)
log="$out/log.txt"
cd "$(dirname "$0")/.."
{ date -u; grep -m1 "model name" /proc/cpuinfo; nproc; $py -c "import torch; print('torch', torch.__version__)"; } \
    2>&1 | tee -a "$log"
run() {   # name, command...
    local name=$1 t0=$SECONDS; shift
    echo "== $name: $*" | tee -a "$log"
    "$@" >>"$log" 2>&1
    echo "== $name: exit $? after $((SECONDS - t0)) s" | tee -a "$log"
}
tidy() {   # a benchmark run's folder: its results, not its charts
    rm -rf "$1"/*.html "$1"/plotly* "$1"/frontier.json "$1"/memory_*.json.gz
    [ -f "$1/results.json" ] && gzip -nf "$1/results.json"
}
bench() {   # name, extra flags...
    local name=$1; shift
    run "$name" $py -m csd bench --dataset "$items" --methods ar,sd,csd --max-new-tokens "$tokens" --no-db \
        --out "$out/$name" "$@"
    tidy "$out/$name"
}
first_start() {   # the app with an empty cache, until it prints its address
    local cache="$out/start/cache" t0 pid
    rm -rf "$cache"; mkdir -p "$cache"
    t0=$(date +%s.%N)
    CSD_CACHE_DIR=$cache $py app.py --port "${PORT:-7869}" --db none >"$out/start/app.log" 2>&1 &
    pid=$!
    until grep -q "running at" "$out/start/app.log"; do
        kill -0 "$pid" 2>/dev/null || { echo "the app exited"; return 1; }
        sleep 0.5
    done
    { echo "to the address: $($py -c "print(round($(date +%s.%N) - $t0, 1))") s"
      sleep 3
      grep -E "VmRSS|VmHWM" "/proc/$pid/status"
      du -sh "$cache"; } | tee "$out/start/start.txt"
    kill "$pid"; wait "$pid" 2>/dev/null
    rm -rf "$cache"
}
avx2_path() {   # prepare, side and app on the kernel's AVX2 build, beside an AVX2 build of llama-bench
    local env=(env CSD_KQUANT_VARIANT=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)
    mkdir -p "$out/avx2"
    run avx2-prepare "${env[@]}" $py -m csd prepare
    run avx2-side "${env[@]}" $py -m csd.bench.llama_side --llama-bench "$LLAMA_BENCH_AVX2" --out "$out/avx2/side" \
        --dataset "$items" --tokens "$tokens"
    tidy "$out/avx2/side/ours"
    run avx2-app "${env[@]}" $py -m csd.cli.app_runs --out "$out/avx2/app" --llama-bench "$LLAMA_BENCH_AVX2"
}   # the AVX2 build's profiles and choices are kept apart from the native build's (its own engine digest)
for s in ${STEPS:-prepare profile keep bench side app start}; do
    case $s in
        prepare) run prepare $py -m csd prepare ;;
        profile) run profile $py -m csd.bench.cpu_profile --out "$out/profile" ;;
        keep) run keep $py -m csd.bench.keep_rate --out "$out/keep" --dataset "${KEEP_ITEMS:-humaneval:8,gsm8k:8}" \
                  --max-new-tokens "$tokens" ;;
        bench) bench bench-default; bench bench-pass --dtype int8 --int8-activations pass ;;
        side) if [ -n "$llama" ]; then run side $py -m csd.bench.llama_side --llama-bench "$llama" --out "$out/side" \
                  --dataset "$items" --tokens "$tokens" --also-dtype "${ALSO_DTYPE:-int8,gguf}"
                  for d in "$out"/side/ours*; do tidy "$d"; done
              else echo "== side: skipped (no LLAMA_BENCH given)" | tee -a "$log"; fi ;;
        app|solo) run app $py -m csd.cli.app_runs --out "$out/app" ${llama:+--llama-bench "$llama"} ;;
        start) mkdir -p "$out/start"; run start first_start ;;
        avx2) if [ -n "${LLAMA_BENCH_AVX2:-}" ]; then avx2_path
              else echo "== avx2: skipped (no LLAMA_BENCH_AVX2 given)" | tee -a "$log"; fi ;;
        *) echo "unknown step $s" | tee -a "$log" ;;
    esac
done
