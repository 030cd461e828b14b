#!/usr/bin/env bash
# Everything the H100 checks and times, in two parts that each fit one device call (~10 min):
#
#   bash benchmarks/run_device.sh check   # correctness: the GEMM matrix (split-K, stream-K and
#                                         # the shipped tuning table included)
#   bash benchmarks/run_device.sh extras  # grouped GEMM checks; scaled fp8: checks, then timing
#   bash benchmarks/run_device.sh time    # bf16 harness (3 shapes), training step, shape sweeps
#   bash benchmarks/run_device.sh sweeps  # the shape sweeps alone, on a shorter budget (~6 min)
#   bash benchmarks/run_device.sh heldout # the held-out sweep and every default checked (~5 min)
#   bash benchmarks/run_device.sh audit   # the second held-out set (pallas_gemm/shapes/audit.json):
#                                         # every default checked, then the sweep (~6 min)
#   bash benchmarks/run_device.sh odd     # rows not a multiple of 8 (NOTES exps. 98, 100): the
#                                         # GPU tests of the dense, grouped and blockwise kernels
#                                         # there, then benchmarks.odd_rows (~6 min)
#   bash benchmarks/run_device.sh skinny  # outputs of N <= 32 (NOTES exp. 101): the skinny device
#                                         # checks, then benchmarks.skinny (~4 min)
#   bash benchmarks/run_device.sh tail    # the tail split (NOTES exp. 125): stream-K device
#                                         # checks, blockwise stream-K GPU tests, then
#                                         # benchmarks.tail_split, fit and held-out (~10 min)
#   bash benchmarks/run_device.sh consumers # three consumer warpgroups (NOTES exps. 129, 131):
#                                         # their device checks, benchmarks.three_consumers, then
#                                         # benchmarks.wave_tile, the default's one-wave rule (~5 min)
#   bash benchmarks/run_device.sh short_k # K <= 128 (NOTES exp. 102): the whole-tile stores'
#                                         # GPU tests, then benchmarks.short_k (~3 min)
#   bash benchmarks/run_device.sh glu     # gated unit and gated MLP: GPU tests, then timing (~7 min)
#   bash benchmarks/run_device.sh blockwise  # blockwise fp8: GPU tests, then timing (~4 min)
#   bash benchmarks/run_device.sh aligned  # blockwise fp8 grouped, each expert's rows a multiple of
#                                         # 128 (DeepGEMM's contiguous layout), then unaligned (~7 min)
#   bash benchmarks/run_device.sh groups # many groups (NOTES exps. 113-114): the grouped GPU
#                                         # tests, then ragged_dot fwd+bwd at 32 and 256 groups
#   bash benchmarks/run_device.sh multi  # 2+ GPUs: sharded and collective GEMM checks (the
#                                         # fused all-gather kernel's first run), TP MLP timing
#   bash benchmarks/run_device.sh new    # one GPU: custom-activation and quantized GPU tests,
#                                         # weight-only and W8A8 timing (~6 min)
#   bash benchmarks/run_device.sh decode # one GPU (~9 min): quantized GPU tests (warp MMA and the
#                                         # grouped kernel included), HBM streaming by TMA box,
#                                         # decode variants (NOTES exp. 90's next step), prefill
#                                         # at 256 and 2048 tokens, grouped int4
#   bash benchmarks/run_device.sh trace  # one GPU (~6 min): quantized GPU tests, decode under the
#                                         # in-kernel profiler (cycles per region), decode timing
#   bash benchmarks/run_device.sh int8   # one GPU (~7 min): the fragments' GPU tests, packed int8's
#                                         # in-kernel trace against K blocks, decode timing at
#                                         # both 8B projections (NOTES exps. 93, 94)
#   bash benchmarks/run_device.sh qmodel # one GPU (~7 min): the Llama model served with int4 and
#                                         # int8 weights (prefill and decode forwards)
#   bash benchmarks/run_device.sh next   # one GPU, queued by NOTES exps. 79-82 (~10 min): the
#                                         # user epilogues' GPU tests (the runtime scalar's
#                                         # first run); the time model before exp. 79 against
#                                         # the shipped one
#                                         # (run it on an H200: the refit was timed on H100s);
#                                         # the GPT model with decode routed whole
#   bash benchmarks/run_device.sh models # both default models with sustained clock, power and
#                                         # joules per step (issue 15's table; ~9 min)
#   bash benchmarks/run_device.sh heldout_models [SIZE...]  # the held-out models
#                                         # (benchmarks.models.HELDOUT), all variants, compiles
#                                         # in one process (~2.5 min a model)
#   bash benchmarks/run_device.sh heldout_model_gemms  # their projections' GEMMs alone
#                                         # (pallas_gemm/shapes/heldout_models.json; ~6 min)
#   bash benchmarks/run_device.sh fill    # the fill rule's routed shapes (benchmarks.fill_route)
#                                         # and 30 random shapes (benchmarks.random_shapes; ~5 min)
#   bash benchmarks/run_device.sh par MODE...  # several GPUs: MODE i on GPU i, all at once
#                                         # (each its own process, $OUT/MODE and power samples),
#                                         # then every MODE's summary
#   bash benchmarks/run_device.sh calibrate  # time every candidate of the fit sweep (~5 min):
#                                         # the data pallas_gemm/heuristics.py is fitted to
#
# Logs and JSON go to $OUT (default ./out); each step has its own time limit, and a
# summary of every step's last lines is printed at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-out}
mkdir -p "$OUT"
noise='cuda_event\|cuda_stream\|Source Location\|external/xla'
steps=()

step() {  # step NAME SECONDS TAIL_LINES COMMAND...
  local name=$1 limit=$2 lines=$3
  shift 3
  local t0=$SECONDS
  timeout "$limit" "$@" 2>&1 | grep -v "$noise" > "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  steps+=("$name|$rc|$((SECONDS - t0))|$lines")
}

case "${1:-}" in
  par)
    shift
    gpu=0
    for mode in "$@"; do
      OUT="$OUT/$mode" CUDA_VISIBLE_DEVICES=$gpu bash "$0" "$mode" > "$OUT/$mode.txt" 2>&1 &
      gpu=$((gpu + 1))
    done
    wait
    gpu=0
    for mode in "$@"; do
      echo "##### $mode (GPU $gpu)"
      gpu=$((gpu + 1))
      cat "$OUT/$mode.txt"
    done
    exit 0
    ;;
  check)  # 143 cases: 421 s were not enough on a cold machine (2026-11-22)
    step gemm_check 570 3 python -u -m benchmarks.device_check --skip-timing
    ;;
  extras)
    step ragged_check 200 4 python -u -m benchmarks.ragged_dot --layouts N --no-grad --rounds 1
    step scaled_matmul 240 12 python -u -m benchmarks.scaled_matmul
    ;;
  time)
    step bf16 150 6 python -u -m benchmarks.matmul --out "$OUT/bf16"
    step train_step 120 4 python -u -m benchmarks.train_step --out "$OUT/train"
    step sweep_llm 200 8 python -u -m benchmarks.matmul --sweep llm --budget-s 150 --out "$OUT/llm"
    step sweep_training 130 8 python -u -m benchmarks.matmul --sweep training --budget-s 100 \
      --out "$OUT/training"
    step sweep_tsk 100 8 python -u -m benchmarks.matmul --sweep tall_skinny_k --compare-split \
      --budget-s 70 --out "$OUT/tsk"
    ;;
  sweeps)
    step sweep_llm 150 8 python -u -m benchmarks.matmul --sweep llm --budget-s 110 --out "$OUT/llm"
    step sweep_training 110 8 python -u -m benchmarks.matmul --sweep training --budget-s 75 \
      --out "$OUT/training"
    step sweep_tsk 90 8 python -u -m benchmarks.matmul --sweep tall_skinny_k --compare-split \
      --budget-s 55 --out "$OUT/tsk"
    ;;
  glu)
    step glu_check 150 3 python -u -m pytest -q -m gpu tests/test_glu.py tests/test_flax_layers.py
    step glu 200 12 python -u -m benchmarks.glu --rounds 3 --iterations 5 --out "$OUT/glu"
    step glu_mlp 220 12 python -u -m benchmarks.glu --block mlp --rounds 3 --iterations 5 \
      --out "$OUT/glu"
    ;;
  groups)
    step groups_check 200 3 python -u -m pytest -q -rf -m gpu tests/test_ragged_dot.py \
      tests/test_blockwise.py -k "device_checks or grouped or ragged"
    step groups_32 150 6 python -u -m benchmarks.ragged_dot --shapes 16384x4096x2048 --groups 32 \
      --layouts N --no-check --rounds 3 --iterations 5 --out "$OUT/groups_32"
    step groups_256 200 6 python -u -m benchmarks.ragged_dot --shapes 16384x4096x2048 \
      --groups 256 --layouts N --no-check --rounds 3 --iterations 5 --out "$OUT/groups_256"
    ;;
  blockwise)
    step blockwise_check 150 3 python -u -m pytest -q -m gpu tests/test_blockwise.py
    step blockwise_fp8 240 20 python -u -m benchmarks.blockwise_fp8 --rounds 3 --iterations 5 \
      --out "$OUT/blockwise"
    step blockwise_grouped 200 8 python -u -m benchmarks.blockwise_fp8 --grouped --rounds 3 \
      --iterations 5 --out "$OUT/blockwise_grouped"
    ;;
  aligned)
    step blockwise_aligned 280 8 python -u -m benchmarks.blockwise_fp8 --grouped --aligned \
      --rounds 3 --iterations 5 --out "$OUT/blockwise_aligned"
    step blockwise_grouped 200 8 python -u -m benchmarks.blockwise_fp8 --grouped --rounds 3 \
      --iterations 5 --out "$OUT/blockwise_grouped"
    ;;
  heldout)
    # A cold H200 needed more than 240 s for the checks (stop 42): 280 + 290 fit one call.
    step check_defaults 280 2 python -u -m benchmarks.calibrate --check heldout,fit,odd
    step sweep_heldout 290 3 python -u -m benchmarks.matmul --sweep heldout --budget-s 250 \
      --out "$OUT/heldout"
    ;;
  audit)
    step check_audit 150 2 python -u -m benchmarks.calibrate --check audit
    step sweep_audit 330 3 python -u -m benchmarks.matmul --sweep audit --budget-s 290 \
      --out "$OUT/audit"
    ;;
  odd)
    step odd_rows_gpu_tests 300 6 python -u -m pytest -q -rf -m gpu tests/test_gemm_gpu.py \
      tests/test_ragged_dot.py tests/test_blockwise.py -k "rows or device_checks"
    step odd_rows 240 12 python -u -m benchmarks.odd_rows
    ;;
  skinny)
    step skinny_gpu_tests 200 4 python -u -m pytest -q -rf -m gpu tests/test_gemm_gpu.py -k skinny
    step skinny 200 18 python -u -m benchmarks.skinny
    ;;
  tail)
    step tail_checks 160 3 python -u -m benchmarks.device_check --only splittail,streamk \
      --skip-timing
    step tail_blockwise_tests 140 3 python -u -m pytest -q -rf -m gpu tests/test_blockwise.py \
      -k stream_k
    step tail_split 280 22 python -u -m benchmarks.tail_split
    ;;
  consumers)
    step consumers_checks 200 3 python -u -m benchmarks.device_check --only consumers3 \
      --skip-timing
    step three_consumers 200 50 python -u -m benchmarks.three_consumers
    step wave_tile 200 28 python -u -m benchmarks.wave_tile --rounds 6
    ;;
  short_k)
    step short_k_gpu_tests 200 4 python -u -m pytest -q -rf -m gpu tests/test_gemm_gpu.py -k short_k
    step short_k 200 16 python -u -m benchmarks.short_k
    ;;
  multi)
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    step multi_gpu_tests 150 3 python -u -m pytest -q -m gpu tests/test_collective_matmul.py
    step multi_gpu 420 40 python -u -m benchmarks.multi_gpu --comm-sms "" --rounds 3 \
      --json "$OUT/multi_gpu.json"
    ;;
  next)
    step user_epilogue_tests 150 3 python -u -m pytest -q -m gpu tests/test_activations.py
    step previous_model 200 12 python -u -m benchmarks.calibrate --compare launch_s=2e-6,tile_fixed_s=0.6e-6,hbm_bytes_per_s=5e12,cta_bytes_per_s=56e9,cluster_fixed_s=0 \
      --sweep heldout,fit,llm,training
    step model_gpt 380 6 python -u -m benchmarks.model --arch gpt --power 5 --json "$OUT/model_gpt.json"
    ;;
  new)
    step new_gpu_tests 200 3 python -u -m pytest -q -m gpu tests/test_activations.py \
      tests/test_quantized.py
    step quantized 330 40 python -u -m benchmarks.quantized --out "$OUT/quantized"
    ;;
  decode)
    step quantized_gpu_tests 220 6 python -u -m pytest -q -rf -m gpu tests/test_quantized.py
    step tma_rate 60 16 python -u -m benchmarks.tma_rate
    step decode 200 10 python -u -m benchmarks.quantized --part weight_only --tokens 1,16,64 \
      --weights 4096x14336,14336x4096 --contenders int4_ours,int4_scalew,int4_4wg,int4_tile,int8_ours \
      --out "$OUT/decode"
    step prefill 150 6 python -u -m benchmarks.quantized --part weight_only --tokens 256,2048 \
      --weights 4096x14336 --contenders int4_ours,int4_xla --out "$OUT/prefill"
    step grouped 120 10 python -u -m benchmarks.quantized --part grouped --routed 16,256 \
      --out "$OUT/grouped"
    ;;
  trace)
    step quantized_gpu_tests 220 6 python -u -m pytest -q -rf -m gpu tests/test_quantized.py
    step decode_trace 200 110 python -u -m benchmarks.decode_trace --tokens 1,16,64 \
      --contenders int4_ours,int4_tile,int8_ours
    step decode 150 10 python -u -m benchmarks.quantized --part weight_only --tokens 1,16,64 \
      --weights 4096x14336 --contenders int4_ours,int4_tile,int8_ours --out "$OUT/decode"
    ;;
  int8)
    step fragments_gpu_tests 200 6 python -u -m pytest -q -rf -m gpu tests/test_fragments.py
    step int8_trace 150 60 python -u -m benchmarks.decode_trace --tokens 16 --cold \
      --contenders int8_ours,int8_kblock
    step int8_decode 240 10 python -u -m benchmarks.quantized --part weight_only --tokens 1,16,64 \
      --weights 4096x14336,14336x4096 --contenders int4_ours,int8_ours,int8_kblock --out "$OUT/int8"
    ;;
  qmodel)
    step quantized_model 420 8 python -u -m benchmarks.model --arch llama --variants xla \
      --quantized 4,8 --in-process --loss-steps 1 --json "$OUT/quantized_model.json"
    ;;
  models)
    step model_gpt 280 6 python -u -m benchmarks.model --arch gpt --power 5 --loss-steps 10 \
      --json "$OUT/model_gpt.json"
    step model_llama 280 6 python -u -m benchmarks.model --arch llama --power 5 --loss-steps 10 \
      --json "$OUT/model_llama.json"
    ;;
  heldout_models)  # MODEL... (default: all four of benchmarks.models.HELDOUT; ~2.5 min each)
    shift
    for one in ${@:-gpt2-small gpt2-medium llama3-3b-4l mistral-7b-2l}; do
      step "model_$one" 240 8 python -u -m benchmarks.model --size "$one" --in-process \
        --loss-steps 5 --decode 1,16 --sources 3 --json "$OUT/model_$one.json"
    done
    ;;
  heldout_model_gemms)  # the held-out models' projection GEMMs against jnp.dot (~6 min)
    step sweep_heldout_models 560 3 python -u -m benchmarks.matmul --sweep heldout_models \
      --budget-s 500 --out "$OUT/heldout_models"
    ;;
  fill)
    step fill_route 300 64 python -u -m benchmarks.fill_route --rounds 5
    step random_shapes 240 32 python -u -m benchmarks.random_shapes --rounds 3
    ;;
  calibrate)
    step calibrate 570 3 python -u -m benchmarks.calibrate --sweep fit --budget-s 500 --out "$OUT"
    ;;
  *)
    echo "usage: $0 check|extras|time|sweeps|heldout|audit|odd|skinny|tail|consumers|short_k|par|glu|blockwise|groups|multi|new|decode|trace|int8|qmodel|next|models|heldout_models|heldout_model_gemms|fill|calibrate" >&2
    exit 2
    ;;
esac

echo
for entry in "${steps[@]}"; do
  IFS='|' read -r name rc seconds lines <<< "$entry"
  echo "=== $name: exit $rc, ${seconds} s ($OUT/$name.log) ==="
  tail -n "$lines" "$OUT/$name.log"
done
