#!/usr/bin/env python3
"""Training-step throughput of the docs/MODEL.md model in PyTorch (eager and torch.compile).

Usage (on a machine with PyTorch and a CUDA GPU):
  python3 train_bench.py --config gpt2 [--batch 8] [--seq 1024] [--dtype bfloat16]
      [--modes eager,compile,max-autotune] [--warmup 5] [--steps 30] [--out rows.jsonl]

Same model and numerics as torch_model.py (its `forward`, attention through SDPA): float32
master weights as leaves, the forward in --dtype, loss in float32, torch.optim.AdamW(fused=True),
random tokens. torch.compile wraps the forward+loss function: mode "compile" is its default
mode, "max-autotune" is mode="max-autotune" (Triton GEMM autotuning and CUDA graphs; its first
step autotunes for minutes, the inductor cache makes reruns quick). Each mode: --warmup
untimed steps, then --steps timed steps with torch.cuda.synchronize() around them.

Output: one JSON object per mode (stdout, and --out when given):
  {"impl": "torch-eager"|"torch-compile"|"torch-compile-max-autotune", "config", "B", "S",
   "dtype", "step_ms", "tok_s",
   "peak_mem_bytes" (torch.cuda.max_memory_allocated), "loss", "compile_s", "torch", "gpu",
   "error"}
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_model  # noqa: E402


# The row name of each mode; flashgraph bench -train reads these.
IMPLS = {"eager": "torch-eager", "compile": "torch-compile", "max-autotune": "torch-compile-max-autotune"}


def bench(mode, cfg, B, S, dtype, warmup, steps, seed):
    torch.manual_seed(seed)
    dev = "cuda"
    params = torch_model.init_params(cfg, seed=seed)
    leaves = {k: v.to(dev).requires_grad_(True) for k, v in params.items()}
    opt = torch.optim.AdamW(leaves.values(), lr=3e-4, weight_decay=0.1, fused=True)
    g = torch.Generator(device=dev).manual_seed(seed)
    tokens = torch.randint(0, cfg["vocab"], (B, S), device=dev, generator=g)
    targets = torch.randint(0, cfg["vocab"], (B, S), device=dev, generator=g)

    def loss_fn(p, t, y):
        return torch_model.forward(p, t, y, cfg, attn="sdpa", dtype=dtype)[0]

    fn = loss_fn
    if mode == "compile":
        fn = torch.compile(loss_fn)
    elif mode == "max-autotune":
        fn = torch.compile(loss_fn, mode="max-autotune")
    # CUDA graphs (max-autotune) reuse their output buffers: mark where a
    # step begins so that the previous step's outputs may be overwritten.
    mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)

    def step():
        if mode == "max-autotune" and mark is not None:
            mark()
        opt.zero_grad(set_to_none=True)
        loss = fn(leaves, tokens, targets)
        loss.backward()
        opt.step()
        return loss

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    step()  # the first step compiles under torch.compile
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    for _ in range(max(0, warmup - 1)):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) * 1e3 / steps
    return {"step_ms": ms, "tok_s": B * S / (ms * 1e-3), "peak_mem_bytes": torch.cuda.max_memory_allocated(),
            "loss": float(loss), "compile_s": compile_s}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="gpt2", choices=list(torch_model.CONFIGS))
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("train_bench.py: no CUDA GPU visible to PyTorch", file=sys.stderr)
        return 2
    cfg = dict(torch_model.CONFIGS[a.config])
    B = a.batch or cfg["batch"]
    S = a.seq or cfg["seq"]
    dtype = torch_model.DTYPES[a.dtype]
    rows = []
    for mode in [m for m in a.modes.split(",") if m]:
        if mode not in IMPLS:
            print(f"train_bench.py: unknown mode {mode!r} (want eager, compile or max-autotune)", file=sys.stderr)
            return 2
        row = {"impl": IMPLS[mode], "config": a.config, "B": B, "S": S, "dtype": a.dtype,
               "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "error": None}
        try:
            row.update(bench(mode, cfg, B, S, dtype, a.warmup, a.steps, a.seed))
        except Exception as e:  # report and go on: one failed mode must not hide the other
            row["error"] = f"{type(e).__name__}: {e}"
        torch.cuda.empty_cache()
        print(json.dumps(row), flush=True)
        rows.append(row)
    if a.out:
        with open(a.out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
