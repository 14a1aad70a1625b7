#!/bin/bash
# old (HEAD, eager draft reading) and new (working tree, late) in turn, AVX2 path, the side bench's items
export CSD_KQUANT_VARIANT=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
for round in 1 2; do
  for arm in old new; do
    dir=/work/main; [ $arm = old ] && dir=/tmp/wt
    cd $dir && date && /work/venv/bin/python -m csd bench --dataset humaneval:4,gsm8k:4 --methods ar,sd,csd --max-new-tokens 128 --no-db --out /tmp/e9/ab/$arm$round > /tmp/e9/ab_$arm$round.log 2>&1
    echo "$arm$round rc $?"
  done
done
date
