#!/bin/bash
export CSD_KQUANT_VARIANT=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
for arm in old new; do
  dir=/work/main; [ $arm = old ] && dir=/tmp/wt
  cd $dir && date && /work/venv/bin/python -m csd bench --dataset /work/main/docs/bench/gguf-epyc5/chat12.txt --methods ar,csd --max-new-tokens 128 --no-db --out /tmp/e9/ab2/$arm > /tmp/e9/ab2_$arm.log 2>&1
  echo "$arm rc $?"
done
date
