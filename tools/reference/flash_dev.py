#!/usr/bin/env python3
"""flash_dev.py: build, check and time kernels/flash_attention.cu on the GPU machine.

Builds kernels/dev/harness.cu (which includes ../flash_attention.cu) with nvcc into a
shared library, loads it with ctypes and, in one process:
  * compiles kernels/flash_attention.cu with NVRTC too (the path the Go backend uses),
  * checks forward O/LSE and backward dQ/dK/dV against a float64 torch reference on
    fresh random inputs, outputs poisoned with NaN, |out-ref| <= atol + rtol*|ref|,
  * times our forward/backward against torch SDPA (FLASH and cuDNN backends).

Usage (on the GPU machine, from tools/reference):
  python3 flash_dev.py            # full tests + full benchmark
  python3 flash_dev.py --quick    # a subset of both
  python3 flash_dev.py --tiny --lib PATH   # small cases only (for compute-sanitizer)
  python3 flash_dev.py --variants          # also time alternative tile shapes (bf16)
Logs go to $OUT (or ./out).
"""
import argparse
import ctypes
import math
import os
import re
import subprocess
import sys
import threading
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
KERNEL = os.path.join(ROOT, "kernels", "flash_attention.cu")
HARNESS = os.path.join(ROOT, "kernels", "dev", "harness.cu")
OUT = os.environ.get("OUT") or os.path.join(ROOT, "out")
CUDA_HOME = os.environ.get("CUDA_HOME", "/usr/local/cuda")

DT_CODE = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
DT_NAME = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}

LOG = None
TINY = False


def log(*a):
    s = " ".join(str(x) for x in a)
    print(s, flush=True)
    if LOG:
        LOG.write(s + "\n")
        LOG.flush()


# ------------------------------------------------------------------ build


def build(lib_path):
    cmd = [
        os.path.join(CUDA_HOME, "bin", "nvcc"), "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
        "-gencode=arch=compute_90a,code=sm_90a", "--ptxas-options=-v", "-lineinfo",
        "-o", lib_path, HARNESS,
    ]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    with open(os.path.join(OUT, "ptxas.log"), "w") as f:
        f.write(r.stdout + r.stderr)
    if r.returncode != 0:
        log(r.stdout[-6000:] + r.stderr[-6000:])
        raise SystemExit("nvcc failed")
    log(f"nvcc build {time.time() - t0:.1f}s -> {lib_path}")
    summarize_ptxas(r.stdout + r.stderr)


def summarize_ptxas(text):
    cur, spill = None, None
    rows = []
    for ln in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)'", ln)
        if m:
            cur = m.group(1)
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", ln)
        if m:
            spill = m.groups()
            continue
        m = re.search(r"Used (\d+) registers", ln)
        if m and cur:
            name = cur
            if name.startswith("_Z"):
                try:
                    name = subprocess.run(["c++filt", cur], capture_output=True, text=True).stdout.strip()
                    name = name.replace("(anonymous namespace)::", "")
                    name = re.sub(r"\(.*", "", re.sub(r"^void ", "", name))
                except Exception:
                    pass
            if "generic" in name or "pre_" in name or "convert" in name:
                cur = None
                continue
            rows.append(f"  {name:60s} regs {m.group(1):>3s}  stack/spill-st/spill-ld {spill}")
            cur = None
    log("ptxas (tensor-core kernels):")
    for r in rows:
        log(r)


def nvrtc_check(result):
    """Compile flash_attention.cu with NVRTC as the Go backend does; list entry points."""
    try:
        nv = None
        for name in ("libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"):
            try:
                nv = ctypes.CDLL(name)
                break
            except OSError:
                continue
        if nv is None:
            import glob
            for p in glob.glob(os.path.join(CUDA_HOME, "lib64", "libnvrtc.so*")):
                try:
                    nv = ctypes.CDLL(p)
                    break
                except OSError:
                    continue
        if nv is None:
            result["err"] = "libnvrtc not found"
            return
        src = open(KERNEL, "rb").read()
        prog = ctypes.c_void_p()
        rc = nv.nvrtcCreateProgram(ctypes.byref(prog), src, b"flash_attention.cu", 0, None, None)
        if rc:
            result["err"] = f"nvrtcCreateProgram {rc}"
            return
        opts = [b"--gpu-architecture=sm_90a", b"-std=c++17", b"-I" + CUDA_HOME.encode() + b"/include"]
        arr = (ctypes.c_char_p * len(opts))(*opts)
        t0 = time.time()
        rc = nv.nvrtcCompileProgram(prog, len(opts), arr)
        dt = time.time() - t0
        n = ctypes.c_size_t()
        nv.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        buf = ctypes.create_string_buffer(n.value + 1)
        nv.nvrtcGetProgramLog(prog, buf)
        result["log"] = buf.value.decode(errors="replace")
        if rc:
            result["err"] = f"nvrtcCompileProgram rc={rc}"
            return
        nv.nvrtcGetCUBINSize(prog, ctypes.byref(n))
        result["ok"] = f"NVRTC compiled flash_attention.cu in {dt:.1f}s, cubin {n.value} bytes"
    except Exception as e:  # noqa: BLE001
        result["err"] = repr(e)


# ------------------------------------------------------------------ library


class Flash:
    def __init__(self, path):
        self.lib = ctypes.CDLL(path)
        P, I, F = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
        self.lib.fa_fwd.argtypes = [I, I, I, P, P, P, P, P, I, I, I, I, F, I, P]
        self.lib.fa_fwd.restype = I
        self.lib.fa_bwd.argtypes = [I, I, I, P, P, P, P, P, P, P, P, P, P, P, I, I, I, I, F, I, P]
        self.lib.fa_bwd.restype = I
        self.lib.fa_error_string.restype = ctypes.c_char_p
        self.lib.fa_error_string.argtypes = [I]

    def _chk(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: {self.lib.fa_error_string(rc).decode()} ({rc})")

    def fwd(self, q, k, v, o, lse, scale, causal, variant=0, generic=False):
        BH, Sq, D = q.shape[0] * q.shape[1], q.shape[2], q.shape[3]
        Sk = k.shape[2]
        st = torch.cuda.current_stream().cuda_stream
        rc = self.lib.fa_fwd(DT_CODE[q.dtype], variant, int(generic), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                             o.data_ptr(), lse.data_ptr(), BH, Sq, Sk, D, scale, int(causal), st)
        self._chk(rc, "fa_fwd")

    def bwd(self, q, k, v, o, do, lse, dq, dk, dv, dsum, dqacc, scale, causal, variant=0, generic=False):
        BH, Sq, D = q.shape[0] * q.shape[1], q.shape[2], q.shape[3]
        Sk = k.shape[2]
        st = torch.cuda.current_stream().cuda_stream
        rc = self.lib.fa_bwd(DT_CODE[q.dtype], variant, int(generic), q.data_ptr(), k.data_ptr(), v.data_ptr(),
                             o.data_ptr(), do.data_ptr(), lse.data_ptr(), dq.data_ptr(), dk.data_ptr(),
                             dv.data_ptr(), dsum.data_ptr(), dqacc.data_ptr(), BH, Sq, Sk, D, scale, int(causal), st)
        self._chk(rc, "fa_bwd")


# ------------------------------------------------------------------ correctness


def reference(q, k, v, do, scale, causal, dtype=torch.float32):
    """float64 reference (top-left causal: key j <= query i).

    Returns O, LSE, dQ, dK, dV and, for O, dQ, dK, dV, their magnitudes: the same
    products computed on absolute values (O_abs = P|V|, dS_abs = P(|dO||V|^T +
    rowsum|dO||O|), dQ_abs = scale dS_abs|K|, ...). Rounding errors are bounded
    componentwise by a multiple of these, also where the result itself cancels
    (e.g. dQ of a query that sees one key is exactly 0). For float16, P and dS are
    rounded to fp16 for the tensor cores, whose subnormals (below 2^-14) carry an
    absolute error up to 2^-25: their magnitudes are floored at 2^-15 (where
    unmasked) so that frac = 2^-10 covers that term.
    """
    q64, k64, v64 = (x.double().requires_grad_(True) for x in (q, k, v))
    s = torch.matmul(q64, k64.transpose(-1, -2)) * scale
    Sq, Sk = q.shape[2], k.shape[2]
    if causal:
        mask = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    o = torch.matmul(p, v64)
    do64 = do.double()
    dq, dk, dv = torch.autograd.grad(o, (q64, k64, v64), do64)
    with torch.no_grad():
        p = p.detach()
        if dtype == torch.float16:
            p = torch.where(p > 0, p.clamp_min(2.0 ** -15), p)
        av, ak, aq, ado = v64.detach().abs(), k64.detach().abs(), q64.detach().abs(), do64.abs()
        o_abs = torch.matmul(p, av)
        d_abs = (ado * o.detach().abs()).sum(-1, keepdim=True)
        ds_abs = p * (torch.matmul(ado, av.transpose(-1, -2)) + d_abs)
        if dtype == torch.float16:
            ds_abs = torch.where(p > 0, ds_abs.clamp_min(2.0 ** -15), ds_abs)
        dq_abs = torch.matmul(ds_abs, ak) * scale
        dk_abs = torch.matmul(ds_abs.transpose(-1, -2), aq) * scale
        dv_abs = torch.matmul(p.transpose(-1, -2), ado)
        del ds_abs, p
    return (o.detach(), lse.detach(), dq, dk, dv), (o_abs, dq_abs, dk_abs, dv_abs)


TOL = {
    # dtype: (atol as a fraction of the magnitude |.|-product, rtol, max relative L2 error)
    torch.bfloat16: (2.0 ** -7, 0.02, 1e-2),
    torch.float16: (2.0 ** -10, 0.004, 2e-3),
    torch.float32: (1e-5, 2e-5, 1e-5),
}


def compare(name, out, ref, mag, dtype, extra_atol=0.0):
    """|out-ref| <= frac*mag + extra + rtol*|ref| elementwise, and ||out-ref||/||ref|| <= l2max.

    The L2 check is skipped where the result is a cancellation (||ref|| < 1e-3 ||mag||).
    """
    out = out.double()
    a_frac, rtol, l2max = TOL[dtype]
    atol = (a_frac * mag if mag is not None else 0.0) + extra_atol
    nan = torch.isnan(out).sum().item()
    err = (out - ref).abs()
    bad = (err > atol + rtol * ref.abs()) | torch.isnan(out)
    nbad = bad.sum().item()
    rn = ref.norm().item()
    en = (out - ref).norm().item()
    rel = en / rn if rn > 0 else (0.0 if en == 0 else float("inf"))
    cancel = mag is not None and rn < 1e-3 * mag.norm().item()
    ok = nbad == 0 and nan == 0 and (cancel or rel <= l2max)
    worst = err.max().item() if err.numel() else 0.0
    first = ""
    if nbad:
        i = bad.flatten().nonzero()[0].item()
        mg = mag.flatten()[i].item() if mag is not None else 0.0
        first = f" [first bad: got {out.flatten()[i].item():.4e} ref {ref.flatten()[i].item():.4e} mag {mg:.3e}]"
    return ok, f"{name}: rel {rel:.2e}{'(c)' if cancel else ''} maxerr {worst:.2e} bad {nbad} nan {nan}{first}", rel


def sdpa_errors(q, k, v, do, scale, causal, ref):
    """Relative L2 errors of torch SDPA (default backend) on the same inputs: context."""
    import torch.nn.functional as F
    qq, kk, vv = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, scale=scale)
    dq, dk, dv = torch.autograd.grad(o, (qq, kk, vv), do)
    outs = (o, dq, dk, dv)
    refs = (ref[0], ref[2], ref[3], ref[4])
    return [(x.double() - r).norm().item() / max(r.norm().item(), 1e-30) for x, r in zip(outs, refs)]


def check_case(fl, dtype, B, H, Sq, Sk, D, causal, generic=False, variant=0, seed=0):
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(seed)
    q = torch.randn(B, H, Sq, D, device=dev, generator=g).to(dtype)
    k = torch.randn(B, H, Sk, D, device=dev, generator=g).to(dtype)
    v = torch.randn(B, H, Sk, D, device=dev, generator=g).to(dtype)
    do = torch.randn(B, H, Sq, D, device=dev, generator=g).to(dtype)
    scale = 1.0 / math.sqrt(D)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((B, H, Sq), float("nan"), device=dev, dtype=torch.float32)
    fl.fwd(q, k, v, o, lse, scale, causal, variant=variant, generic=generic)
    dq = torch.full_like(q, float("nan"))
    dk = torch.full_like(k, float("nan"))
    dv = torch.full_like(v, float("nan"))
    dsum = torch.full((B, H, Sq), float("nan"), device=dev, dtype=torch.float32)
    dqacc = torch.full((B, H, Sq, D), float("nan"), device=dev, dtype=torch.float32)
    fl.bwd(q, k, v, o, do, lse, dq, dk, dv, dsum, dqacc, scale, causal, variant=variant, generic=generic)
    torch.cuda.synchronize()
    ref, mag = reference(q, k, v, do, scale, causal, dtype)
    ro, rl, rdq, rdk, rdv = ref
    # fp16 subnormals (below 2^-14) are spaced 2^-24: rounding P, dS or an output
    # there errs by up to 2^-25 absolutely, whatever the magnitude.
    sub = 2.0 ** -23 if dtype == torch.float16 else 0.0
    res = [
        compare("O", o, ro, mag[0], dtype, extra_atol=sub),
        compare("LSE", lse, rl, None, torch.float32, extra_atol=1e-3 if dtype != torch.float32 else 1e-4),
        compare("dQ", dq, rdq, mag[1], dtype, extra_atol=sub),
        compare("dK", dk, rdk, mag[2], dtype, extra_atol=sub),
        compare("dV", dv, rdv, mag[3], dtype, extra_atol=sub),
    ]
    ok = all(r[0] for r in res)
    msg = "; ".join(r[1] for r in res)
    if dtype != torch.float32 and Sq == Sk and Sq > 1 and not generic and not TINY:
        se = sdpa_errors(q, k, v, do, scale, causal, ref)
        ours = [res[0][2], res[2][2], res[3][2], res[4][2]]
        msg += " | rel L2 ours/sdpa O,dQ,dK,dV: " + " ".join(f"{a / b:.2f}" for a, b in zip(ours, se))
    tag = (f"{DT_NAME[dtype]} {'gen' if generic else 'tc '}{variant} B{B} H{H} Sq{Sq:5d} Sk{Sk:5d} D{D:3d} "
           f"causal{int(causal)}")
    return ok, tag, msg


def run_checks(fl, mode, variants):
    cases = []
    if mode == "tiny":
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            for D in (64, 128):
                cases.append((dt, 1, 2, 70, 70, D, True, False, 0))
                cases.append((dt, 1, 1, 17, 130, D, False, False, 0))
        cases.append((torch.bfloat16, 1, 1, 33, 33, 80, True, True, 0))
    else:
        Ss = (1, 17, 128, 1000, 4097) if mode == "full" else (1, 17, 128, 1000)
        dts = (torch.bfloat16, torch.float16, torch.float32) if mode == "full" else (torch.bfloat16, torch.float32)
        for dt in dts:
            for S in Ss:
                for D in (64, 128):
                    for causal in (False, True):
                        B, H = (1, 2) if S > 1000 else (2, 3)
                        cases.append((dt, B, H, S, S, D, causal, dt == torch.float32, 0))
        pairs = ((17, 128), (128, 17), (1000, 300), (300, 1000), (1, 4097), (4097, 513))
        if mode != "full":
            pairs = pairs[:4]
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            for (sq, sk) in pairs:
                for D in (64, 128):
                    for causal in (False, True):
                        cases.append((dt, 1, 2, sq, sk, D, causal, dt == torch.float32, 0))
        # generic path on bf16/fp16 and odd head dims
        for dt in (torch.bfloat16, torch.float16, torch.float32):
            for D in (32, 80, 64):
                for causal in (False, True):
                    cases.append((dt, 1, 2, 300, 257, D, causal, True, 0))
        cases.append((torch.float32, 1, 1, 129, 129, 256, True, True, 0))
        cases.append((torch.float32, 1, 1, 65, 200, 1, False, True, 0))
        for vnt in variants:
            for D in (64, 128):
                for causal in (False, True):
                    for (sq, sk) in ((1000, 1000), (300, 777)):
                        cases.append((torch.bfloat16, 1, 2, sq, sk, D, causal, False, vnt))
    npass = nfail = 0
    t0 = time.time()
    for i, (dt, B, H, Sq, Sk, D, causal, gen, vnt) in enumerate(cases):
        try:
            ok, tag, msg = check_case(fl, dt, B, H, Sq, Sk, D, causal, generic=gen, variant=vnt, seed=1000 + i)
        except Exception as e:  # noqa: BLE001
            ok, tag, msg = False, f"{DT_NAME[dt]} Sq{Sq} Sk{Sk} D{D} causal{int(causal)} v{vnt}", repr(e)
        if ok:
            npass += 1
        else:
            nfail += 1
        log(("PASS " if ok else "FAIL ") + tag + " | " + msg)
    log(f"correctness: {npass} passed, {nfail} failed ({time.time() - t0:.1f}s)")
    return nfail == 0


# ------------------------------------------------------------------ benchmark


def time_fn(fn, warm=3, iters=10):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def run_bench(fl, Ss, Ds, variants, fwd_variants_only=False):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    dt = torch.bfloat16
    rows = []
    hdr = (f"{'D':>4} {'S':>6} {'c':>2} | {'fwd ours':>8} {'flash':>7} {'cudnn':>7} {'r/fl':>5} {'r/cd':>5} | "
           f"{'bwd ours':>8} {'flash':>7} {'cudnn':>7} {'r/fl':>5} {'r/cd':>5}")
    for D in Ds:
        for causal in (False, True):
            for S in Ss:
                H = 2048 // D
                B = max(1, 16384 // S)
                torch.manual_seed(S + D)
                q = torch.randn(B, H, S, D, device="cuda", dtype=dt)
                k = torch.randn(B, H, S, D, device="cuda", dtype=dt)
                v = torch.randn(B, H, S, D, device="cuda", dtype=dt)
                do = torch.randn(B, H, S, D, device="cuda", dtype=dt)
                scale = 1.0 / math.sqrt(D)
                o = torch.empty_like(q)
                lse = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
                dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
                dsum = torch.empty(B, H, S, device="cuda", dtype=torch.float32)
                dqacc = torch.empty(B, H, S, D, device="cuda", dtype=torch.float32)
                flops = 4.0 * B * H * S * S * D * (0.5 if causal else 1.0)
                res = {}
                for vnt in variants:
                    tf = time_fn(lambda: fl.fwd(q, k, v, o, lse, scale, causal, variant=vnt))
                    tb = time_fn(lambda: fl.bwd(q, k, v, o, do, lse, dq, dk, dv, dsum, dqacc, scale, causal,
                                                variant=vnt))
                    res[f"ours{vnt}"] = (tf, tb)
                for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        qq, kk, vv = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
                        with sdpa_kernel(be):
                            out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, scale=scale)
                            tf = time_fn(lambda: F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal,
                                                                                scale=scale))
                            tb = time_fn(lambda: torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True))
                        res[name] = (tf, tb)
                        del out, qq, kk, vv
                    except Exception as e:  # noqa: BLE001
                        log(f"  {name} unavailable at D{D} S{S}: {str(e)[:120]}")
                        res[name] = (float("nan"), float("nan"))
                tfl = {kk_: (flops / t[0] / 1e9, 2.5 * flops / t[1] / 1e9) for kk_, t in res.items()}
                rows.append((D, S, causal, tfl))
                best = max((x for x in tfl if x.startswith("ours")), key=lambda x: tfl[x][0])
                log(f"  D{D} S{S} causal{int(causal)}: " + ", ".join(
                    f"{n} fwd {t[0]:.0f} bwd {t[1]:.0f}" for n, t in tfl.items()))
                del q, k, v, do, o, lse, dq, dk, dv, dsum, dqacc
                torch.cuda.empty_cache()
    # table
    lines = ["", "TFLOP/s, bf16, B*S=16k tokens, H*D=2048 (fwd 4BHS^2D, /2 causal; bwd 2.5x fwd); ours = variant 0",
             hdr, "-" * len(hdr)]
    for (D, S, causal, tfl) in rows:
        of, ob = tfl["ours0"]
        ff, fb = tfl["flash"]
        cf, cb = tfl["cudnn"]
        lines.append(f"{D:>4} {S:>6} {int(causal):>2} | {of:8.0f} {ff:7.0f} {cf:7.0f} {of / ff:5.2f} {of / cf:5.2f} | "
                     f"{ob:8.0f} {fb:7.0f} {cb:7.0f} {ob / fb:5.2f} {ob / cb:5.2f}")
    if len(variants) > 1:
        lines.append("")
        lines.append("variants (fwd/bwd TFLOP/s): " + " ".join(f"v{x}" for x in variants))
        for (D, S, causal, tfl) in rows:
            lines.append(f"{D:>4} {S:>6} {int(causal):>2} | " + "  ".join(
                f"v{x} {tfl[f'ours{x}'][0]:4.0f}/{tfl[f'ours{x}'][1]:4.0f}" for x in variants))
    for ln in lines:
        log(ln)


# ------------------------------------------------------------------ main


def main():
    global LOG, TINY
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="subset of checks and benchmark")
    ap.add_argument("--tiny", action="store_true", help="small checks only (for compute-sanitizer)")
    ap.add_argument("--lib", help="use this prebuilt harness library instead of building")
    ap.add_argument("--variants", default="0", help="comma-separated variants to check and time (bf16)")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--bench-s", default=None, help="comma-separated S list for the benchmark")
    args = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    TINY = args.tiny
    LOG = open(os.path.join(OUT, "tiny.log" if args.tiny else "flash_dev.log"), "a")
    log(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, args {vars(args)}")

    lib = args.lib
    nvrtc = {}
    th = None
    if not lib:
        lib = os.path.join("/tmp", "libflash_dev.so")
        th = threading.Thread(target=nvrtc_check, args=(nvrtc,))
        th.start()
        build(lib)
    fl = Flash(lib)
    torch.zeros(1, device="cuda")
    ok = True
    if th is not None:
        th.join()
        if "ok" in nvrtc:
            log(nvrtc["ok"])
        else:
            ok = False
            log("NVRTC FAILED:", nvrtc.get("err"), nvrtc.get("log", "")[-4000:])
    variants = [int(x) for x in args.variants.split(",")]
    if not args.no_check:
        mode = "tiny" if args.tiny else ("quick" if args.quick else "full")
        ok = run_checks(fl, mode, [x for x in variants if x != 0]) and ok
    if not args.tiny and not args.no_bench:
        if args.bench_s:
            Ss = [int(x) for x in args.bench_s.split(",")]
        else:
            Ss = (1024, 4096) if args.quick else (512, 1024, 2048, 4096, 8192, 16384)
        run_bench(fl, Ss, (64, 128), variants)
    log("ALL CHECKS PASSED" if ok else "SOME CHECKS FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
