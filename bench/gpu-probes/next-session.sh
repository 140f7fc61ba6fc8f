#!/usr/bin/env bash
# Issue 21's and issue 29's open GPU checks as one prepared device call (written 2026-11-26,
# packing added 2026-11-28; not yet run). Budget: ≤ 8 min of device time (the limits below sum
# to 470 s plus start-up). A captured BERT-base update compiles in 47-77 s cold (25 s forward/
# backward only; 7 s from inductor's cache, shared by every step here), so the later parts of a
# step may be cut by its limit: every step writes its JSON as it goes.
#
# From the repo root on the device machine, with STS-B dev carried in an ignored folder:
#   mkdir -p cache/eval/downstream/STS && cp -r ../shared/data/senteval/downstream/STS/STSBenchmark cache/eval/downstream/STS/
#   mkdir -p cache/eval/text cache/eval/captions/flickr8k    # real sentence lengths (issue 29)
#   cp -r ../shared/data/text/wiki1m_sample cache/eval/text/
#   cp -r ../shared/data/captions/coco_val2017 cache/eval/captions/
#   cp ../shared/data/captions/flickr8k/Flickr8k.token.txt cache/eval/captions/flickr8k/
#   run(command="bash bench/gpu-probes/next-session.sh cache/eval", carry=["cache/eval"], timeout_s=580)
#   rm -r cache/eval        # never kept in the project
# Each step has its own time limit and writes its results to $OUT as it goes, so a step that runs
# out of time leaves the others' figures. Steps, most needed first:
#   0. issue 29 (bench/gpu-probes/packing.py): the attention options at 32 tokens; captured
#      SimCSE packed vs padded on Wiki and COCO sentences with MFU on padded and on real tokens,
#      the 25 costliest kernels and the time outside them; whole-update vs forward-only capture
#      at BERT-base 128 and 64 and MiniLM 64; then the 'packing' bench section (real ÷ computed
#      tokens, packed ÷ padded);
#   1. the captured step of SimCSE, the text methods and VisualCSE/AudioCSE (ms, ÷ SimCSE, MFU,
#      compile s cold, ops outside the graphs, host reads) — the JSON is rewritten per method
#      (packed by default since issue 29: every text method's captured ratio, packed);
#   2. the CUDA tests (never run on a GPU yet; tests/test_packing.py's flex/varlen included);
#   3. mmcse vs sentence-transformers' Trainer and the dev evaluation's share of a run.
# A dry run of the script itself on a CPU (tiny sizes; the CUDA tests skip):
#   DEVICE=cpu OUT=/tmp/dry bash bench/gpu-probes/next-session.sh ../shared/data/senteval
set -u
EVAL=${1:?usage: next-session.sh EVAL_DIR (SentEval layout holding downstream/STS/STSBenchmark)}
OUT=${OUT:-$PWD/bench-out}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
export TORCHINDUCTOR_CACHE_DIR="$OUT/.inductor"  # steps 2 and 3 reuse step 1's compiled graphs
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
{ nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
  python -c "import torch, transformers; print(torch.__version__, transformers.__version__)"
  python -c "import sentence_transformers, datasets, accelerate" 2>&1 | tail -1; } > "$OUT/env.txt" 2>&1

export PACKING_DATA="${PACKING_DATA:-$EVAL}"  # text/ and captions/ copied beside downstream/
timeout 50 python3 bench/gpu-probes/packing.py attention > "$OUT/0a-attention.log" 2>&1
echo "packing attention: rc $?" >> "$OUT/steps.txt"
OUT="$OUT/packed" timeout 140 python3 bench/gpu-probes/packing.py packed > "$OUT/0b-packed.log" 2>&1
echo "packing packed: rc $?" >> "$OUT/steps.txt"
OUT="$OUT/regimes" timeout 110 python3 bench/gpu-probes/packing.py regimes > "$OUT/0c-regimes.log" 2>&1
echo "packing regimes: rc $?" >> "$OUT/steps.txt"

# every method's eager step is timed before the captured ones: two runs, so that the first
# brings the captured figures of SimCSE, MCSE and VisualCSE even if the second runs out of time
for part in "1a 90 simcse mcse visualcse" "1b 60 kdmcse mcseo dalr audiocse"; do
  set -- $part
  name=$1 limit=$2; shift 2
  timeout "$limit" python3 cli.py bench all --device "$DEVICE" --sections train \
    $(printf -- '--method %s ' "$@") --out "$OUT/results-cuda-train-$name.json" > "$OUT/$name-train.log" 2>&1
  echo "train $name: rc $?" >> "$OUT/steps.txt"
done

timeout 30 python -m pytest -m cuda tests/training/test_cuda.py tests/test_packing.py -q -p no:cacheprovider \
  > "$OUT/2-pytest-cuda.log" 2>&1
echo "pytest -m cuda: rc $?" >> "$OUT/steps.txt"

timeout 30 python3 cli.py bench all --device "$DEVICE" --sections versus_st,dev_eval --eval-data "$EVAL" \
  --out "$OUT/results-cuda-side.json" > "$OUT/3-side.log" 2>&1
echo "versus_st,dev_eval: rc $?" >> "$OUT/steps.txt"
rm -rf "$OUT/.inductor"  # not worth bringing back
