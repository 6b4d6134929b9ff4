#!/usr/bin/env python3
"""Times PyTorch F.scaled_dot_product_attention, forward and backward, per SDPA backend.

Usage (GPU machine):
  python3 sdpa_bench.py [--backends flash,cudnn,efficient,math] [--seqs 512,1024,...]
      [--head-dims 64,128] [--causal both|causal|noncausal] [--tokens 16384] [--width 2048]
      [--iters 20] [--warmup 5] [--settle-ms 0] [--math-max-seq 8192] [--dtype bfloat16|float16]
      [--out FILE] [--decode-sq 1,16] [--kv-heads 8,1]

Shapes: q, k, v are [B, H, S, D] with B = tokens / S and H = width / D (defaults: B·S = 16384
tokens, H·D = 2048), random normal, dtype bf16 by default.

--kv-heads 8,1 times grouped-query attention too: k and v are [B, H_kv, S, D] for each H_kv of
the list and SDPA runs with enable_gqa=True (torch 2.5 or later); an entry equal to H (or 0) is
plain multi-head attention, without enable_gqa, and an entry that does not divide H is an error.
Without --kv-heads only multi-head attention is timed. The FLOP count is the same as for H heads.

Output: one JSON object per line (stdout, or --out FILE), one per (backend, S, D, H_kv, causal):
  {"backend": "flash"|"cudnn"|"efficient"|"math",
   "B": int, "H": int, "H_kv": int, "S": int, "D": int, "causal": bool, "dtype": "bfloat16",
                              (H_kv: K/V heads, H for multi-head attention)
   "fwd_ms": float|null,      median forward time (CUDA events, after warm-up)
   "bwd_ms": float|null,      median backward time alone: torch.autograd.grad(out, (q,k,v), dout,
                              retain_graph=True) on one retained forward graph
   "fwd_tflops": float|null,  fwd_flops / fwd_ms; fwd_flops = 4·B·H·S²·D, halved when causal
   "bwd_tflops": float|null,  2.5·fwd_flops / bwd_ms
   "peak_mem_bytes": int|null torch.cuda.max_memory_allocated over this record's runs
                              (inputs, output and gradients included)
   "iters": int, "gpu": str, "torch": str,
   "error": str|null}         set (and the timings null) when the backend refused the shape,
                              ran out of memory, or was skipped (math above --math-max-seq)
A human-readable table goes to stderr.

--decode-sq 1,16 times generation instead: q is [B, H, Sq, D] for each Sq of the list, k and v
[B, H, S, D] (B = tokens / S, H = width / D as above), forward only, non-causal (SDPA's is_causal
is top-left aligned: a row of Sq <= 16 would see at most 16 keys). Those records add "Sq": int and
"kv_gbps": float|null (K and V bytes / fwd_ms); "S" is the key count, bwd_* are null and the
TFLOP/s count 4·B·H·Sq·S·D.
"""
import argparse
import json
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


# Seconds the device idles before each timed loop (--settle-ms): see there.
SETTLE_S = 0.0


def _median_ms(fn, warmup, iters):
    if SETTLE_S > 0:
        torch.cuda.synchronize()
        time.sleep(SETTLE_S)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    evs = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        evs.append((s, e))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in evs)


def bench_one(backend, B, H, S, D, causal, dtype, warmup, iters, H_kv=None):
    """Forward and backward times and peak memory; K and V of H_kv heads (None: H) take enable_gqa=True."""
    H_kv = H if H_kv is None else H_kv
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, h, S, D, device="cuda", dtype=dtype, generator=g).requires_grad_(True)
               for h in (H, H_kv, H_kv))
    dout = torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=g)
    # Multi-head attention passes no enable_gqa, so it runs on torch before 2.5 as it always did.
    gqa = {"enable_gqa": True} if H_kv != H else {}
    with sdpa_kernel([BACKENDS[backend]]):
        def fwd():
            with torch.no_grad():
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)
        fwd_ms = _median_ms(fwd, warmup, iters)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal, **gqa)

        def bwd():
            return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
        bwd_ms = _median_ms(bwd, warmup, iters)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out, q, k, v, dout
    return fwd_ms, bwd_ms, peak


def bench_decode(backend, B, H, Sq, S, D, dtype, warmup, iters):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, H, Sq, D, device="cuda", dtype=dtype, generator=g)
    k, v = (torch.randn(B, H, S, D, device="cuda", dtype=dtype, generator=g) for _ in range(2))
    with sdpa_kernel([BACKENDS[backend]]), torch.no_grad():
        fwd_ms = _median_ms(lambda: F.scaled_dot_product_attention(q, k, v), warmup, iters)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del q, k, v
    return fwd_ms, peak


def run_decode(a, backends, seqs, dims, sqs, dtype, gpu, sink):
    print(f"{'backend':10} {'Sq':>3} {'S':>6} {'D':>4} {'fwd_us':>9} {'KV_GB/s':>9}", file=sys.stderr)
    for D in dims:
        for S in seqs:
            if a.tokens % S or a.width % D:
                print(f"skip S={S} D={D}: tokens/width not divisible", file=sys.stderr)
                continue
            B, H = a.tokens // S, a.width // D
            for Sq in sqs:
                for b in backends:
                    rec = dict(backend=b, B=B, H=H, Sq=Sq, S=S, D=D, causal=False, dtype=a.dtype,
                               fwd_ms=None, bwd_ms=None, fwd_tflops=None, bwd_tflops=None, kv_gbps=None,
                               peak_mem_bytes=None, iters=a.iters, gpu=gpu, torch=torch.__version__,
                               error=None)
                    try:
                        with warnings.catch_warnings(record=True) as caught:
                            warnings.simplefilter("always")
                            try:
                                f_ms, peak = bench_decode(b, B, H, Sq, S, D, dtype, a.warmup, a.iters)
                            except torch.cuda.OutOfMemoryError:
                                raise
                            except RuntimeError as e:
                                why = "; ".join(str(w.message).split("\n")[0] for w in caught)
                                raise RuntimeError(f"{e}".split("\n")[0] + (f" [{why}]" if why else "")) from None
                        kv = 2 * B * H * S * D * torch.finfo(dtype).bits // 8
                        rec.update(fwd_ms=round(f_ms, 5),
                                   fwd_tflops=round(4.0 * B * H * Sq * S * D / (f_ms * 1e-3) / 1e12, 3),
                                   kv_gbps=round(kv / (f_ms * 1e-3) / 1e9, 1), peak_mem_bytes=int(peak))
                    except torch.cuda.OutOfMemoryError as e:
                        rec["error"] = "out of memory: " + str(e).split("\n")[0][:200]
                    except RuntimeError as e:
                        rec["error"] = str(e).replace("\n", " ")[:500]
                    torch.cuda.empty_cache()
                    sink.write(json.dumps(rec) + "\n")
                    sink.flush()
                    if rec["error"]:
                        print(f"{b:10} {Sq:>3} {S:>6} {D:>4}  {rec['error'][:80]}", file=sys.stderr)
                    else:
                        print(f"{b:10} {Sq:>3} {S:>6} {D:>4} {rec['fwd_ms'] * 1e3:>9.1f} {rec['kv_gbps']:>9.0f}",
                              file=sys.stderr)


def parse_kv_heads(s):
    """--kv-heads as a list of non-negative ints ([] when empty)."""
    out = []
    for f in s.split(","):
        f = f.strip()
        if not f:
            continue
        try:
            n = int(f)
        except ValueError:
            n = -1
        if n < 0:
            raise ValueError(f"--kv-heads: {f!r} is not a head count")
        out.append(n)
    return out


def kv_heads_for(kv_list, H):
    """The K/V head counts to time at H query heads, in --kv-heads order, each once: H for multi-head
    attention (an empty list, 0 or H); an entry that does not divide H raises ValueError (as
    flashgraph bench's AttentionShapes, which resolves -kv-heads the same way)."""
    out = []
    for n in kv_list or [H]:
        n = H if n == 0 else n
        if H % n:
            raise ValueError(f"--kv-heads {n}: must divide H = {H}")
        if n not in out:
            out.append(n)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description="PyTorch SDPA timings per backend (JSON lines)")
    ap.add_argument("--backends", default="flash,cudnn,efficient,math")
    ap.add_argument("--seqs", default="512,1024,2048,4096,8192,16384")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--causal", choices=["both", "causal", "noncausal"], default="both")
    ap.add_argument("--tokens", type=int, default=16384, help="B·S")
    ap.add_argument("--width", type=int, default=2048, help="H·D")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--settle-ms", type=float, default=0.0,
                    help="let the device idle this long before each timed loop's warm-up (flashgraph bench "
                         "passes its -settle, so that both sides start every loop from the same state)")
    ap.add_argument("--math-max-seq", type=int, default=8192,
                    help="skip the MATH backend above this S (it materialises S×S scores)")
    ap.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    ap.add_argument("--out", default=None, help="write JSON lines here instead of stdout")
    ap.add_argument("--decode-sq", default="",
                    help="time decode forwards instead: these query counts against S keys (e.g. 1,16)")
    ap.add_argument("--kv-heads", default="",
                    help="K/V head counts H_kv to time (e.g. 8,1): grouped-query attention with enable_gqa=True; "
                         "an entry equal to H, or 0, is multi-head attention (default: multi-head only)")
    a = ap.parse_args(argv)
    global SETTLE_S
    SETTLE_S = max(0.0, a.settle_ms) / 1e3
    if not torch.cuda.is_available():
        print("sdpa_bench: no CUDA device", file=sys.stderr)
        return 2
    dtype = getattr(torch, a.dtype)
    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    for b in backends:
        if b not in BACKENDS:
            ap.error(f"unknown backend {b!r}; choose from {','.join(BACKENDS)}")
    seqs = [int(s) for s in a.seqs.split(",")]
    dims = [int(d) for d in a.head_dims.split(",")]
    causals = {"both": [False, True], "causal": [True], "noncausal": [False]}[a.causal]
    try:
        kv_list = parse_kv_heads(a.kv_heads)
    except ValueError as e:
        ap.error(str(e))
    if kv_list and a.decode_sq:
        ap.error("--kv-heads: --decode-sq times multi-head attention only")
    for D in dims:
        if a.width % D == 0:
            try:
                kv_heads_for(kv_list, a.width // D)
            except ValueError as e:
                ap.error(f"D={D}: {e}")
    gpu = torch.cuda.get_device_name()
    sink = open(a.out, "w") if a.out else sys.stdout
    if a.decode_sq:
        run_decode(a, backends, seqs, dims, [int(x) for x in a.decode_sq.split(",")], dtype, gpu, sink)
        if a.out:
            sink.close()
        return 0
    print(f"{'backend':10} {'S':>6} {'D':>4} {'causal':>6} {'fwd_ms':>9} {'bwd_ms':>9} "
          f"{'fwd_TF/s':>9} {'bwd_TF/s':>9} {'peak_GiB':>8}", file=sys.stderr)
    for D in dims:
        for S in seqs:
            if a.tokens % S or a.width % D:
                print(f"skip S={S} D={D}: tokens/width not divisible", file=sys.stderr)
                continue
            B, H = a.tokens // S, a.width // D
            for H_kv, causal in ((kv, c) for kv in kv_heads_for(kv_list, H) for c in causals):
                flops = 4.0 * B * H * S * S * D / (2 if causal else 1)
                for b in backends:
                    rec = dict(backend=b, B=B, H=H, H_kv=H_kv, S=S, D=D, causal=causal, dtype=a.dtype,
                               fwd_ms=None, bwd_ms=None, fwd_tflops=None, bwd_tflops=None,
                               peak_mem_bytes=None, iters=a.iters, gpu=gpu, torch=torch.__version__,
                               error=None)
                    if b == "math" and S > a.math_max_seq:
                        rec["error"] = f"skipped: S > --math-max-seq {a.math_max_seq}"
                    else:
                        try:
                            with warnings.catch_warnings(record=True) as caught:
                                warnings.simplefilter("always")
                                try:
                                    f_ms, b_ms, peak = bench_one(b, B, H, S, D, causal, dtype, a.warmup, a.iters,
                                                                 H_kv)
                                except torch.cuda.OutOfMemoryError:
                                    raise
                                except TypeError as e:
                                    if "enable_gqa" not in str(e):
                                        raise
                                    raise RuntimeError(f"torch {torch.__version__} has no SDPA enable_gqa "
                                                       f"(2.5 or later)") from None
                                except RuntimeError as e:
                                    # the backend's reasons for refusing come as warnings
                                    why = "; ".join(str(w.message).split("\n")[0] for w in caught)
                                    raise RuntimeError(f"{e}".split("\n")[0] + (f" [{why}]" if why else "")) from None
                            rec.update(fwd_ms=round(f_ms, 4), bwd_ms=round(b_ms, 4),
                                       fwd_tflops=round(flops / (f_ms * 1e-3) / 1e12, 2),
                                       bwd_tflops=round(2.5 * flops / (b_ms * 1e-3) / 1e12, 2),
                                       peak_mem_bytes=int(peak))
                        except torch.cuda.OutOfMemoryError as e:
                            rec["error"] = "out of memory: " + str(e).split("\n")[0][:200]
                        except RuntimeError as e:
                            rec["error"] = str(e).replace("\n", " ")[:500]
                        torch.cuda.empty_cache()
                    sink.write(json.dumps(rec) + "\n")
                    sink.flush()
                    label = f"{b:10} {S:>6} {D:>4} {str(causal):>6}" + (f" H_kv={H_kv}" if H_kv != H else "")
                    if rec["error"]:
                        print(f"{label}  {rec['error'][:80]}", file=sys.stderr)
                    else:
                        print(f"{label} {rec['fwd_ms']:>9.3f} {rec['bwd_ms']:>9.3f} "
                              f"{rec['fwd_tflops']:>9.1f} {rec['bwd_tflops']:>9.1f} "
                              f"{rec['peak_mem_bytes'] / 2**30:>8.2f}", file=sys.stderr)
    if a.out:
        sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
