#!/usr/bin/env python3
"""Error of attention forward and backward against a float64 reference: ours and PyTorch SDPA's.

Usage (GPU machine; `flashgraph bench -accuracy` writes DIR and runs this):
  python3 sdpa_error.py --dir DIR [--out FILE] [--backends cudnn,flash] [--device cuda|cpu]
      [--block-rows 1024]
  python3 sdpa_error.py --selftest

DIR holds manifest.json and raw little-endian tensors:
  {"format": "flashgraph-attention-accuracy/2",
   "cases": [{"name": str, "dtype": "bfloat16"|"float16", "B": int, "H": int, "H_kv": int, "S": int,
              "D": int, "causal": bool, "scale": float,
              "files": {"q", "do", "o", "dq": 16-bit [B, H, S, D], "k", "v", "dk", "dv": 16-bit
                        [B, H_kv, S, D], as uint16 bit patterns; "lse": float32 [B, H, S], natural
                        log; paths relative to DIR}}, ...],
   ...free-form keys (device, seed, env)}
q, k, v, do are the inputs (dO is the cotangent of O); o, lse, dq, dk, dv our kernels' outputs.
H_kv < H is grouped-query attention: query head h reads K/V head h // (H / H_kv), and dK, dV of a
K/V head are the sums over the query heads of its group; SDPA then runs with enable_gqa=True
(torch 2.5 or later). H_kv = H is multi-head attention. (Format 1 had no H_kv: K/V of H heads.)

For each case the reference is float64 attention computed from the SAME 16-bit inputs (widened
exactly): S = scale·Q·Kᵀ, causal mask top-left aligned (key j visible to query i iff j <= i; here
Sq = Sk, so it is SDPA's is_causal too), P = softmax(S), O = P·V, LSE = logsumexp(S), and the exact
gradients for the cotangent dO: dV = Pᵀ·dO, dP = dO·Vᵀ, dS = P∘(dP − rowsum(dO∘O)),
dQ = scale·dS·K, dK = scale·dSᵀ·Q. It runs one head at a time and --block-rows query rows at a time,
so memory stays at a few block-rows × S float64 matrices. PyTorch's F.scaled_dot_product_attention
runs on the same 16-bit tensors with one backend forced (torch.nn.attention.sdpa_kernel:
CUDNN_ATTENTION, FLASH_ATTENTION), same scale, is_causal, forward and then backward with the same dO.

Output: one JSON object per line (stdout, or --out FILE), one per (case, impl):
  {"case": str, "impl": "ours"|"cudnn"|"flash", "dtype": str, "B", "H", "S", "D": int,
   "H_kv": int, "causal": bool, "scale": float,
   "metrics": {"o"|"lse"|"dq"|"dk"|"dv": {
       "rel_l2": float|null,      ‖x − ref‖₂ / ‖ref‖₂ over the whole tensor (null if x has a NaN/Inf)
       "max_abs": float|null,     max |x − ref| (null likewise)
       "ref_max_abs": float,      max |ref|, the scale of max_abs
       "nonfinite": int}},        NaN/Inf elements of x (an element never written stays NaN)
   "error": str|null,             set, and "metrics" {}, when the backend refused the shape (with
                                  PyTorch's reasons), ran out of memory, or is missing here
   "gpu": str, "torch": str, "ref_device": str}
"lse" is in ours only (SDPA returns no LSE through its public API). A readable table goes to
stderr. Exit status: 0 when every case was read and its reference computed, whatever the errors;
2 when the files, the manifest or the device are not usable (no CUDA with --device cuda).
Needs only torch and numpy; no network.
"""
import argparse
import json
import math
import os
import sys
import tempfile
import warnings

import numpy as np
import torch
import torch.nn.functional as F

FORMAT = "flashgraph-attention-accuracy/2"
OUTPUTS = ("o", "lse", "dq", "dk", "dv")
INPUTS = ("q", "k", "v", "do")
SDPA_BACKENDS = ("cudnn", "flash")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


class InputError(Exception):
    """The manifest or a tensor file is not what the manifest says."""


def load_manifest(d):
    path = os.path.join(d, "manifest.json")
    try:
        with open(path) as f:
            m = json.load(f)
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: {e}") from None
    if m.get("format") != FORMAT:
        raise InputError(f"{path}: format {m.get('format')!r}, want {FORMAT!r}")
    cases = m.get("cases")
    if not isinstance(cases, list) or not cases:
        raise InputError(f"{path}: no cases")
    for c in cases:
        for key in ("name", "dtype", "B", "H", "H_kv", "S", "D", "causal", "scale", "files"):
            if key not in c:
                raise InputError(f"{path}: case {c.get('name', '?')} has no {key!r}")
        if c["dtype"] not in DTYPES:
            raise InputError(f"{path}: case {c['name']}: dtype {c['dtype']!r}, want one of {sorted(DTYPES)}")
        if min(c["B"], c["H"], c["H_kv"], c["S"], c["D"]) < 1:
            raise InputError(f"{path}: case {c['name']}: every dim must be positive")
        if c["H"] % c["H_kv"]:
            raise InputError(f"{path}: case {c['name']}: H_kv {c['H_kv']} must divide H {c['H']}")
        for name in INPUTS + OUTPUTS:
            if name not in c["files"]:
                raise InputError(f"{path}: case {c['name']} has no file {name!r}")
    return m


def read_tensor(d, rel, dtype, shape):
    """A raw little-endian file as a CPU tensor: 16-bit types from their bit patterns, float32 as is."""
    path = os.path.join(d, rel)
    try:
        raw = np.fromfile(path, dtype="<f4" if dtype == torch.float32 else "<i2")
    except OSError as e:
        raise InputError(f"{path}: {e}") from None
    n = math.prod(shape)
    if raw.size != n:
        raise InputError(f"{path}: {raw.size} elements, want {n} ({list(shape)})")
    t = torch.from_numpy(raw.astype(raw.dtype.newbyteorder("="), copy=False)).reshape(shape)
    return t if dtype == torch.float32 else t.view(dtype)


def reference_head(q, k, v, do, scale, causal, block_rows):
    """Float64 attention of one head ([S, D] each): O, LSE, dQ, dK, dV (see the module docstring)."""
    S = q.shape[0]
    o, dq = torch.empty_like(q), torch.empty_like(q)
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    lse = torch.empty(S, dtype=q.dtype, device=q.device)
    for r0 in range(0, S, block_rows):
        r1 = min(S, r0 + block_rows)
        # Causal rows [r0, r1) see keys [0, r1) at most: the rest is masked anyway.
        kend = r1 if causal else k.shape[0]
        kb, vb, qb, dob = k[:kend], v[:kend], q[r0:r1], do[r0:r1]
        s = (qb @ kb.T) * scale
        if causal:
            i = torch.arange(r0, r1, device=q.device)[:, None]
            j = torch.arange(kend, device=q.device)[None, :]
            s.masked_fill_(j > i, float("-inf"))
        m = s.amax(dim=1, keepdim=True)
        p = torch.exp(s - m)
        ls = p.sum(dim=1, keepdim=True)
        p /= ls
        lse[r0:r1] = (m + torch.log(ls)).squeeze(1)
        ob = p @ vb
        o[r0:r1] = ob
        ds = p * (dob @ vb.T - (dob * ob).sum(dim=1, keepdim=True))
        dq[r0:r1] = (ds @ kb) * scale
        dk[:kend] += (ds.T @ qb) * scale
        dv[:kend] += p.T @ dob
    return {"o": o, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


class ErrorStats:
    """Running ‖x − ref‖², ‖ref‖², max |x − ref|, max |ref| and the non-finite count of one output."""

    def __init__(self):
        self.err2 = self.ref2 = self.max_abs = self.ref_max = 0.0
        self.nonfinite = 0

    def add(self, got, ref):
        got = got.to(device=ref.device, dtype=torch.float64)
        bad = int((~torch.isfinite(got)).sum())
        self.nonfinite += bad
        self.ref2 += float((ref * ref).sum())
        self.ref_max = max(self.ref_max, float(ref.abs().max()))
        if bad == 0:
            diff = got - ref
            self.err2 += float((diff * diff).sum())
            self.max_abs = max(self.max_abs, float(diff.abs().max()))

    def result(self):
        if self.nonfinite:
            rel = mx = None
        else:
            rel = math.sqrt(self.err2 / self.ref2) if self.ref2 > 0 else math.sqrt(self.err2)
            mx = self.max_abs
        return {"rel_l2": rel, "max_abs": mx, "ref_max_abs": self.ref_max, "nonfinite": self.nonfinite}


def run_sdpa(backend, q, k, v, do, scale, causal):
    """PyTorch SDPA forward and backward with one backend forced: O, dQ ([B, H, S, D]), dK, dV ([B, H_kv,
    S, D]); K and V with fewer heads than Q run with enable_gqa=True."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        raise RuntimeError(f"torch {torch.__version__} has no torch.nn.attention.sdpa_kernel (2.3 or later)") from None
    forced = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    # Multi-head attention passes no enable_gqa, so it runs on torch before 2.5 as it always did.
    gqa = {"enable_gqa": True} if k.shape[1] != q.shape[1] else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel([forced]):
                o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal, scale=scale, **gqa)
                dq, dk, dv = torch.autograd.grad(o, (qq, kk, vv), do)
            torch.cuda.synchronize()
        except torch.cuda.OutOfMemoryError:
            raise
        except TypeError as e:
            if "enable_gqa" not in str(e):
                raise
            raise RuntimeError(f"torch {torch.__version__} has no SDPA enable_gqa (2.5 or later)") from None
        except RuntimeError as e:
            why = "; ".join(str(w.message).split("\n")[0] for w in caught)
            raise RuntimeError(str(e).split("\n")[0] + (f" [{why}]" if why else "")) from None
    return {"o": o.detach(), "dq": dq, "dk": dk, "dv": dv}


def run_case(d, c, backends, device, block_rows, gpu):
    """The records of one case: ours, then each SDPA backend."""
    dtype = DTYPES[c["dtype"]]
    B, H, H_kv, S, D = c["B"], c["H"], c["H_kv"], c["S"], c["D"]
    scale, causal = float(c["scale"]), bool(c["causal"])
    shapes = {"q": (B, H, S, D), "do": (B, H, S, D), "o": (B, H, S, D), "dq": (B, H, S, D), "lse": (B, H, S),
              "k": (B, H_kv, S, D), "v": (B, H_kv, S, D), "dk": (B, H_kv, S, D), "dv": (B, H_kv, S, D)}
    files = c["files"]
    inputs = {n: read_tensor(d, files[n], dtype, shapes[n]).to(device) for n in INPUTS}
    impls = {"ours": {n: read_tensor(d, files[n], torch.float32 if n == "lse" else dtype, shapes[n]).to(device)
                      for n in OUTPUTS}}
    errors = {"ours": None}
    for b in backends:
        errors[b] = None
        if device.type != "cuda":
            errors[b] = f"SDPA {b} needs CUDA (--device {device.type})"
            continue
        try:
            impls[b] = run_sdpa(b, inputs["q"], inputs["k"], inputs["v"], inputs["do"], scale, causal)
        except torch.cuda.OutOfMemoryError as e:
            errors[b] = "out of memory: " + str(e).split("\n")[0][:200]
        except RuntimeError as e:
            errors[b] = str(e).replace("\n", " ")[:500]
        if device.type == "cuda":
            torch.cuda.empty_cache()
    stats = {name: {n: ErrorStats() for n in outs} for name, outs in impls.items()}
    group = H // H_kv
    for bi in range(B):
        for hk in range(H_kv):
            k64, v64 = (inputs[n][bi, hk].to(torch.float64) for n in ("k", "v"))
            dk, dv = torch.zeros_like(k64), torch.zeros_like(v64)
            # The query heads of K/V head hk; its dK, dV sum over them.
            for h in range(hk * group, (hk + 1) * group):
                ref = reference_head(inputs["q"][bi, h].to(torch.float64), k64, v64,
                                     inputs["do"][bi, h].to(torch.float64), scale, causal, block_rows)
                dk += ref["dk"]
                dv += ref["dv"]
                for name, outs in impls.items():
                    for n in ("o", "lse", "dq"):
                        if n in outs:
                            stats[name][n].add(outs[n][bi, h], ref[n])
            for name, outs in impls.items():
                for n, ref in (("dk", dk), ("dv", dv)):
                    if n in outs:
                        stats[name][n].add(outs[n][bi, hk], ref)
    recs = []
    for name in ["ours"] + list(backends):
        recs.append(dict(case=c["name"], impl=name, dtype=c["dtype"], B=B, H=H, H_kv=H_kv, S=S, D=D, causal=causal,
                         scale=scale, metrics={n: s.result() for n, s in stats.get(name, {}).items()},
                         error=errors[name], gpu=gpu, torch=torch.__version__, ref_device=str(device)))
    return recs


def fmt(x):
    return "-" if x is None else f"{x:.2e}"


def main(argv=None):
    ap = argparse.ArgumentParser(description="attention error vs a float64 reference: ours, SDPA cuDNN and FLASH "
                                             "(JSON lines)")
    ap.add_argument("--dir", help="directory written by `flashgraph bench -accuracy` (manifest.json)")
    ap.add_argument("--out", default=None, help="write JSON lines here instead of stdout")
    ap.add_argument("--backends", default=",".join(SDPA_BACKENDS),
                    help="SDPA backends to compare (cudnn, flash; empty for none)")
    ap.add_argument("--device", default="cuda", help="where the reference and SDPA run (cuda; cpu for tests)")
    ap.add_argument("--block-rows", type=int, default=1024, help="query rows per float64 reference block")
    ap.add_argument("--selftest", action="store_true", help="check the reference and the file reader on the CPU")
    a = ap.parse_args(argv)
    if a.selftest:
        return selftest()
    if not a.dir:
        ap.error("--dir is required")
    backends = [b.strip() for b in a.backends.split(",") if b.strip()]
    for b in backends:
        if b not in SDPA_BACKENDS:
            ap.error(f"unknown backend {b!r}; choose from {','.join(SDPA_BACKENDS)}")
    if a.block_rows < 1:
        ap.error("--block-rows must be positive")
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"sdpa_error: no CUDA device (torch {torch.__version__}, torch.cuda.is_available() is False)",
              file=sys.stderr)
        return 2
    try:
        m = load_manifest(a.dir)
    except InputError as e:
        print(f"sdpa_error: {e}", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False  # float64 does not use TF32; say so for any float32 path
    sink = open(a.out, "w") if a.out else sys.stdout
    print(f"sdpa_error: torch {torch.__version__} on {gpu}; rel L2 error vs float64 (O, LSE, dQ, dK, dV)",
          file=sys.stderr)
    try:
        for c in m["cases"]:
            try:
                recs = run_case(a.dir, c, backends, device, a.block_rows, gpu)
            except InputError as e:
                print(f"sdpa_error: {e}", file=sys.stderr)
                return 2
            for r in recs:
                sink.write(json.dumps(r) + "\n")
                sink.flush()
                if r["error"]:
                    print(f"{r['case']:28} {r['impl']:6} {r['error'][:100]}", file=sys.stderr)
                else:
                    print(f"{r['case']:28} {r['impl']:6} " +
                          " ".join(f"{n} {fmt(r['metrics'][n]['rel_l2'])}" for n in OUTPUTS if n in r["metrics"]),
                          file=sys.stderr)
    finally:
        if a.out:
            sink.close()
    return 0


def math_attention(q, k, v, scale, causal):
    """Plain float64 attention for the self-test: O and LSE, differentiable."""
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v, torch.logsumexp(s, dim=-1)


def selftest():
    """The blocked reference against autograd of plain attention, and a round trip through files."""
    g = torch.Generator().manual_seed(0)
    for causal in (False, True):
        for S, D, block in ((37, 8, 5), (16, 4, 16), (9, 3, 100)):
            q, k, v, do = (torch.randn(S, D, dtype=torch.float64, generator=g) for _ in range(4))
            ref = reference_head(q, k, v, do, 0.3, causal, block)
            qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
            o, lse = math_attention(qq, kk, vv, 0.3, causal)
            dq, dk, dv = torch.autograd.grad(o, (qq, kk, vv), do)
            for name, want in (("o", o), ("lse", lse), ("dq", dq), ("dk", dk), ("dv", dv)):
                err = float((ref[name] - want.detach()).abs().max())
                assert err < 1e-12, f"causal={causal} S={S} block={block}: {name} off by {err}"
    st = ErrorStats()
    x = torch.randn(100, dtype=torch.float64, generator=g)
    st.add(x[:50] * (1 + 1e-3), x[:50])
    st.add(x[50:] * (1 + 1e-3), x[50:])
    r = st.result()
    assert abs(r["rel_l2"] - 1e-3) < 1e-12 and r["nonfinite"] == 0, r
    st.add(torch.tensor([float("nan")]), torch.tensor([1.0], dtype=torch.float64))
    assert st.result()["rel_l2"] is None and st.result()["nonfinite"] == 1

    # A manifest with "ours" = the reference rounded to bf16: errors of bf16 rounding size. Case "c" is
    # multi-head; in case "g" (grouped-query, H_kv = 2 of H = 4) ours is autograd of plain attention on K/V
    # repeated per query head, so the blocked reference's grouping (h // group, dK and dV summed over the
    # group) meets an independent one.
    B, S, D = 1, 33, 8
    with tempfile.TemporaryDirectory() as d:
        cases = []
        for name, H, H_kv in (("c", 2, 2), ("g", 4, 2)):
            files = {}
            ins = {n: torch.randn(B, H_kv if n in ("k", "v") else H, S, D, generator=g).to(torch.bfloat16)
                   for n in INPUTS}
            if H_kv == H:
                refs = [reference_head(*(ins[n][0, h].double() for n in INPUTS), 0.25, True, 7) for h in range(H)]
                outs = {n: torch.stack([r[n] for r in refs])[None] for n in OUTPUTS}
            else:
                qq, kk, vv = (ins[n].double().requires_grad_(True) for n in ("q", "k", "v"))
                rep = H // H_kv
                o, lse = math_attention(qq, kk.repeat_interleave(rep, dim=1), vv.repeat_interleave(rep, dim=1),
                                        0.25, True)
                dq, dk, dv = torch.autograd.grad(o, (qq, kk, vv), ins["do"].double())
                outs = {"o": o.detach(), "lse": lse.detach(), "dq": dq, "dk": dk, "dv": dv}
            for n, t in list(ins.items()) + list(outs.items()):
                files[n] = f"{name}/{n}.bin"
                os.makedirs(os.path.join(d, name), exist_ok=True)
                arr = t.float().numpy().astype("<f4") if n == "lse" else t.to(torch.bfloat16).view(torch.int16).numpy()
                arr.astype(arr.dtype.newbyteorder("<")).tofile(os.path.join(d, files[n]))
            cases.append(dict(name=name, dtype="bfloat16", B=B, H=H, H_kv=H_kv, S=S, D=D, causal=True, scale=0.25,
                              files=files))
        man = {"format": FORMAT, "cases": cases}
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump(man, f)
        out = os.path.join(d, "out.jsonl")
        rc = main(["--dir", d, "--out", out, "--device", "cpu", "--block-rows", "5"])
        assert rc == 0, rc
        with open(out) as f:
            recs = [json.loads(line) for line in f]
        assert [(r["case"], r["impl"]) for r in recs] == [(c, i) for c in "cg" for i in ("ours", "cudnn", "flash")], recs
        for r in (recs[0], recs[3]):
            ours = r["metrics"]
            for n in ("o", "dq", "dk", "dv"):
                assert 0 < ours[n]["rel_l2"] < 2 ** -8, (r["case"], n, ours[n])
            assert ours["lse"]["rel_l2"] < 1e-7, (r["case"], ours["lse"])
        assert recs[3]["H_kv"] == 2 and recs[0]["H_kv"] == 2 and recs[3]["H"] == 4, recs[3]
        assert recs[1]["error"] and recs[1]["metrics"] == {}, recs[1]
        cases[1]["H_kv"] = 3
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump(man, f)
        assert main(["--dir", d, "--out", out, "--device", "cpu"]) == 2
        cases[1]["H_kv"] = 2
        cases[0]["files"]["o"] = "c/q.bin.missing"
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump(man, f)
        assert main(["--dir", d, "--out", out, "--device", "cpu"]) == 2
    print("sdpa_error selftest: ok", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
