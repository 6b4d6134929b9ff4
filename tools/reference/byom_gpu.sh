#!/bin/sh
# The part of the bring-your-own-model check that needs torch >= 2.5 and a GPU
# (run from tools/reference on the GPU machine, with ../../flashgraph built):
#   sh byom_gpu.sh [OUT]            (OUT defaults to ../../out/byom)
# 1. exports gpt2_small and llama_gqa with the dynamo exporter (opset 18; SDPA
#    and explicit attention) and with the TorchScript exporter using SDPA
#    (opset 17, SDPA decomposed by the exporter; and explicit attention, as the
#    committed onnx/testdata/byom files, from torch 1.13), and trains each in PyTorch
#    float32 on the CPU (the reference the Go test TestBYOMTrainsLikePyTorch
#    reads once the files are copied to onnx/testdata/byom), and on CUDA in
#    bfloat16 (autocast) and float32 (the bf16 noise);
# 2. trains every export with flashgraph, fused (-fuse=require), on the same
#    sequential batches: float32 on the CPU, compared at 1e-4 relative; bf16 on
#    CUDA, compared with PyTorch's bf16 within |PyTorch bf16 - PyTorch float32|.
# Each comparison prints a table and a JSON line; the script goes on after a
# failed one and exits 1 at the end if any failed.
set -u
OUT=${1:-../../out/byom}
FG=${FG:-../../flashgraph}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
FG=$(cd "$(dirname "$FG")" && pwd)/$(basename "$FG")
export PYTHONUNBUFFERED=1
fail=0
for flags in "--dynamo --attn sdpa" "--dynamo --attn explicit" "--attn sdpa" "--attn explicit"; do
    # shellcheck disable=SC2086
    python3 byom_models.py --out-dir "$OUT" $flags || fail=1
    for dt in bfloat16 float32; do
        # shellcheck disable=SC2086
        python3 byom_models.py --out-dir "$OUT" $flags --no-export --device cuda --dtype $dt || fail=1
    done
done
for f in "$OUT"/*.onnx; do
    m=$(basename "$f" .onnx)
    common="-fuse=require -data-order sequential -steps 20 -warmup 0 -min-lr-frac 1 -lr 1e-3 -data $OUT/data.txt -loss next-token"
    # The dynamo exporter merges equal initializers, folds the tied
    # lm_head's Transpose into a second table and writes RoPE's buffers
    # as initializers: undo the first two, freeze the third.
    case $m in
    *dynamo*) common="$common -untie -retie"
        case $m in llama*) common="$common -freeze slice_*" ;; esac ;;
    esac
    # shellcheck disable=SC2086
    if "$FG" train $common -out "$OUT/fg_cpu_$m" "$f" >"$OUT/fg_cpu_$m.log" 2>&1; then
        python3 byom_models.py --compare "$OUT/$m.losses.json" "$OUT/fg_cpu_$m/ckpt/step-00000020.safetensors" --rtol 1e-4 || fail=1
    else
        echo "$m: flashgraph cpu float32 failed (see $OUT/fg_cpu_$m.log)"; tail -5 "$OUT/fg_cpu_$m.log"; fail=1
    fi
    # shellcheck disable=SC2086
    if "$FG" train $common -device cuda -dtype bf16 -out "$OUT/fg_cuda_$m" "$f" >"$OUT/fg_cuda_$m.log" 2>&1; then
        python3 byom_models.py --compare "$OUT/$m.losses.cuda.bfloat16.json" "$OUT/fg_cuda_$m/ckpt/step-00000020.safetensors" \
            --noise "$OUT/$m.losses.cuda.float32.json" || fail=1
    else
        echo "$m: flashgraph cuda bf16 failed (see $OUT/fg_cuda_$m.log)"; tail -5 "$OUT/fg_cuda_$m.log"; fail=1
    fi
done
exit $fail
