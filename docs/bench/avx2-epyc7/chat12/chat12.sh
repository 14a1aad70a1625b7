#!/bin/bash
# chat12 on the kernel's AVX2 path beside llama.cpp's AVX2 build: llama-bench tg128, the bench, then tg128 and
# pg54,128 again. Usage: TARGET_GGUF=target.gguf bash chat12.sh OUT_DIR LLAMA_BENCH_AVX2 (from the repository root,
# its environment active; the target GGUF as csd.runtime.embedded.assemble_gguf writes it)
set -u
out=$(mkdir -p "$1" && cd "$1" && pwd); lb=$2; gguf=${TARGET_GGUF:?the target GGUF}
export CSD_KQUANT_VARIANT=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
"$lb" -m "$gguf" -t 2 -p 0 -n 128 -r 3 > "$out/ll_before.md"
python -m csd bench --dataset docs/bench/gguf-epyc5/chat12.txt --methods ar,sd,csd --max-new-tokens 128 --no-db \
    --out "$out/chat12" > "$out/bench.log" 2>&1
"$lb" -m "$gguf" -t 2 -p 0 -n 128 -r 3 > "$out/ll_after.md"
"$lb" -m "$gguf" -t 2 -p 0 -n 0 -pg 54,128 -r 3 > "$out/ll_pg.md"
