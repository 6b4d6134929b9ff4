#!/usr/bin/env python3
"""The flashgraph transformer of docs/MODEL.md in PyTorch: forward, loss and gradients.

Usage (on the GPU machine, from tools/reference/):
  python3 torch_model.py --weights W.safetensors --batch B.safetensors --out OUT.safetensors \
      [--attn composed|sdpa] [--dtype float32|bfloat16|float64] [--device cuda|cpu] [--heads H]
  python3 torch_model.py --selftest [--device cuda|cpu]

Inputs
  W.safetensors: every parameter under its MODEL.md name (tok_emb, layers.{i}.attn_norm, wq, wk,
    wv, wo, q_norm, k_norm, mlp_norm, w_gate, w_up, w_down, final_norm, lm_head), any float dtype,
    weight matrices stored [in, out] (forward is x @ W).
  B.safetensors: int64 (or int32) `tokens` and `targets`, both [B, S].
  The config is inferred from shapes: vocab and dim from tok_emb, layers from the layer names,
  head_dim from q_norm, H*D from wq, ffn from w_gate. heads = H*D / head_dim. If `--heads` is
  given, or the weights file's `__metadata__` has a "config" entry holding a JSON object
  (e.g. {"config": "{\"vocab\":256,\"dim\":64,\"layers\":2,\"heads\":4,\"head_dim\":16,\"ffn\":128}"}),
  those values are checked against the shapes (a mismatch is an error). The flag wins over the
  metadata when both are present and disagree with each other.

Output OUT.safetensors
  loss            scalar, in the dtype it was computed in (float32 for float32/bfloat16 runs,
                  float64 for float64 runs)
  logits          [B, S, V] float32
  grad.<name>     float32, one per parameter (d loss / d parameter)
  __metadata__    {"config": json, "attn": ..., "dtype": ..., "device": ...}

Numerics: parameters stay float32 leaves; the forward casts them to --dtype. In bfloat16 runs
the loss (log-softmax + NLL) is computed in float32 from bf16 logits. RoPE tables are computed
in float64 and cast. The composed attention path is exactly MODEL.md's graph (MatMul, Mul by
1/sqrt(D), Add of a 0/-inf mask, Softmax, MatMul); `sdpa` uses F.scaled_dot_product_attention
with is_causal=True and scale=1/sqrt(D).
"""
import argparse
import json
import math
import os
import sys
import tempfile

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import st_io  # noqa: E402

EPS = 1e-5
ROPE_THETA = 10000.0

CONFIGS = {
    "tiny": dict(vocab=256, dim=64, layers=2, heads=4, head_dim=16, ffn=128, seq=32, batch=4),
    "small": dict(vocab=256, dim=256, layers=4, heads=4, head_dim=64, ffn=768, seq=256, batch=8),
    "gpt2": dict(vocab=256, dim=768, layers=12, heads=12, head_dim=64, ffn=3072, seq=1024, batch=8),
    "gpt2-medium": dict(vocab=256, dim=1024, layers=24, heads=16, head_dim=64, ffn=4096, seq=1024, batch=8),
    "gpt3-1.3b": dict(vocab=256, dim=2048, layers=24, heads=16, head_dim=128, ffn=8192, seq=1024, batch=8),
}

LAYER_PARAMS = ["attn_norm", "wq", "wk", "wv", "wo", "q_norm", "k_norm", "mlp_norm",
                "w_gate", "w_up", "w_down"]


def param_names(layers):
    names = ["tok_emb"]
    for i in range(layers):
        names += [f"layers.{i}.{p}" for p in LAYER_PARAMS]
    return names + ["final_norm", "lm_head"]


def param_shapes(cfg):
    V, d, H, D, f = cfg["vocab"], cfg["dim"], cfg["heads"], cfg["head_dim"], cfg["ffn"]
    KV = cfg.get("kv_heads") or H  # grouped-query attention: KV key/value heads
    per = {"attn_norm": [d], "wq": [d, H * D], "wk": [d, KV * D], "wv": [d, KV * D],
           "wo": [H * D, d], "q_norm": [D], "k_norm": [D], "mlp_norm": [d],
           "w_gate": [d, f], "w_up": [d, f], "w_down": [f, d]}
    shapes = {"tok_emb": [V, d], "final_norm": [d], "lm_head": [d, V]}
    for i in range(cfg["layers"]):
        for p, s in per.items():
            shapes[f"layers.{i}.{p}"] = s
    return shapes


def init_params(cfg, seed=0, dtype=torch.float32):
    """MODEL.md initialisation: norms ones; matrices and embedding N(0, 0.02);
    wo and w_down N(0, 0.02/sqrt(2*layers)). (Same distribution as model/, not the same bits.)"""
    g = torch.Generator().manual_seed(seed)
    out = {}
    resid_std = 0.02 / math.sqrt(2 * cfg["layers"])
    for name, shape in param_shapes(cfg).items():
        if name.endswith("norm"):
            out[name] = torch.ones(shape, dtype=dtype)
        else:
            std = resid_std if name.endswith((".wo", ".w_down")) else 0.02
            out[name] = (torch.randn(shape, generator=g, dtype=torch.float64) * std).to(dtype)
    return out


def infer_config(params, heads=None, meta_config=None):
    if "tok_emb" not in params:
        raise ValueError("weights: no tok_emb")
    V, d = params["tok_emb"].shape
    layers = 0
    while f"layers.{layers}.wq" in params:
        layers += 1
    if layers == 0:
        raise ValueError("weights: no layers.0.wq")
    D = params["layers.0.q_norm"].shape[0]
    HD = params["layers.0.wq"].shape[1]
    if HD % D:
        raise ValueError(f"wq width {HD} is not a multiple of head_dim {D}")
    KVD = params["layers.0.wk"].shape[1]
    if KVD % D or (HD // D) % (KVD // D):
        raise ValueError(f"wk width {KVD} is not a whole number of key/value heads of {D} dividing the {HD // D} heads")
    cfg = dict(vocab=int(V), dim=int(d), layers=layers, heads=HD // D, head_dim=int(D),
               ffn=int(params["layers.0.w_gate"].shape[1]))
    if KVD != HD:
        cfg["kv_heads"] = KVD // D
    for src, given in (("metadata config", meta_config or {}), ("--heads", {"heads": heads} if heads else {})):
        for k, v in given.items():
            if k in cfg and int(v) != cfg[k]:
                raise ValueError(f"{src}: {k}={v} but the tensor shapes say {cfg[k]}")
    want = param_shapes(cfg)
    for name, shape in want.items():
        if name not in params:
            raise ValueError(f"weights: missing {name}")
        if list(params[name].shape) != shape:
            raise ValueError(f"weights: {name} has shape {list(params[name].shape)}, want {shape}")
    extra = sorted(set(params) - set(want))
    if extra:
        raise ValueError(f"weights: unexpected tensors {extra[:5]}")
    return cfg


def rmsnorm(x, w):
    return x * (1.0 / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)) * w


def rope_tables(S, D, dtype, device):
    i = torch.arange(D // 2, dtype=torch.float64)
    freq = ROPE_THETA ** (-2.0 * i / D)
    ang = torch.arange(S, dtype=torch.float64)[:, None] * freq[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)
    sin = torch.cat([ang.sin(), ang.sin()], -1)
    return cos.to(device=device, dtype=dtype), sin.to(device=device, dtype=dtype)


def rope(x, cos, sin):
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], -1)
    return x * cos + rot * sin


def causal_mask(S, dtype, device):
    return torch.full((S, S), float("-inf"), dtype=dtype, device=device).triu(1)


def attention(q, k, v, mode):
    D = q.shape[-1]
    if mode == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0 / math.sqrt(D))
    S = q.shape[-2]
    s = torch.matmul(q, k.transpose(-1, -2))
    s = s * (1.0 / math.sqrt(D))
    s = s + causal_mask(S, s.dtype, s.device)
    p = torch.softmax(s, dim=-1)
    return torch.matmul(p, v)


def forward(params, tokens, targets, cfg, attn="composed", dtype=torch.float32):
    """Returns (loss, logits). params: dict name -> tensor (any float dtype; cast to dtype)."""
    P = {k: v.to(dtype) for k, v in params.items()}
    B, S = tokens.shape
    H, D = cfg["heads"], cfg["head_dim"]
    cos, sin = rope_tables(S, D, dtype, tokens.device)
    x = F.embedding(tokens, P["tok_emb"])
    for i in range(cfg["layers"]):
        L = lambda n: P[f"layers.{i}.{n}"]  # noqa: E731
        h = rmsnorm(x, L("attn_norm"))
        q, k, v = h @ L("wq"), h @ L("wk"), h @ L("wv")
        KV = k.shape[-1] // D
        q = q.reshape(B, S, H, D).transpose(1, 2)
        k, v = (t.reshape(B, S, KV, D).transpose(1, 2) for t in (k, v))
        q = rope(rmsnorm(q, L("q_norm")), cos, sin)
        k = rope(rmsnorm(k, L("k_norm")), cos, sin)
        if KV != H:  # repeat_kv: query head h reads key/value head h // (H // KV)
            k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
        o = attention(q, k, v, attn)
        o = o.transpose(1, 2).reshape(B, S, H * D)
        x = x + o @ L("wo")
        h = rmsnorm(x, L("mlp_norm"))
        x = x + (F.silu(h @ L("w_gate")) * (h @ L("w_up"))) @ L("w_down")
    x = rmsnorm(x, P["final_norm"])
    logits = x @ P["lm_head"]
    lf = logits.float() if logits.dtype in (torch.bfloat16, torch.float16) else logits
    loss = F.cross_entropy(lf.reshape(B * S, cfg["vocab"]), targets.reshape(B * S), reduction="mean")
    return loss, logits


def run(params, tokens, targets, cfg, attn, dtype, device):
    """Forward + backward. Returns dict of output tensors (CPU)."""
    leaves = {k: v.detach().to(device=device, dtype=torch.float32 if dtype != torch.float64 else torch.float64)
              .requires_grad_(True) for k, v in params.items()}
    tokens = tokens.to(device=device, dtype=torch.int64)
    targets = targets.to(device=device, dtype=torch.int64)
    loss, logits = forward(leaves, tokens, targets, cfg, attn, dtype)
    names = list(leaves)
    grads = torch.autograd.grad(loss, [leaves[n] for n in names])
    out = {"loss": loss.detach().cpu(), "logits": logits.detach().float().cpu()}
    for n, g in zip(names, grads):
        out["grad." + n] = g.detach().float().cpu()
    return out


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights")
    ap.add_argument("--batch")
    ap.add_argument("--out")
    ap.add_argument("--attn", choices=["composed", "sdpa"], default="composed")
    ap.add_argument("--dtype", choices=list(DTYPES), default="float32")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None,
                    help="default: cuda when available, else cpu")
    ap.add_argument("--heads", type=int, default=None)
    ap.add_argument("--selftest", action="store_true")
    a = ap.parse_args(argv)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a.selftest:
        return selftest(device)
    if not (a.weights and a.batch and a.out):
        ap.error("--weights, --batch and --out are required (or --selftest)")
    params, meta = st_io.read(a.weights)
    meta_cfg = json.loads(meta["config"]) if "config" in meta else None
    cfg = infer_config(params, a.heads, meta_cfg)
    batch, _ = st_io.read(a.batch)
    for k in ("tokens", "targets"):
        if k not in batch:
            raise SystemExit(f"{a.batch}: no tensor '{k}'")
    if batch["tokens"].shape != batch["targets"].shape or batch["tokens"].dim() != 2:
        raise SystemExit("tokens and targets must both be [B, S]")
    out = run(params, batch["tokens"], batch["targets"], cfg, a.attn, DTYPES[a.dtype], device)
    st_io.write(a.out, out, {"config": json.dumps(cfg), "attn": a.attn, "dtype": a.dtype,
                             "device": device})
    print(json.dumps({"loss": out["loss"].item(), "config": cfg, "attn": a.attn,
                      "dtype": a.dtype, "device": device, "out": a.out}))
    return 0


# ---------------------------------------------------------------- self-test

def _maxdiff(a, b):
    return (a.double() - b.double()).abs().max().item()


def _compare(tag, x, y, atol, rtol):
    worst, where = 0.0, ""
    for k in x:
        d = (x[k].double() - y[k].double()).abs()
        lim = atol + rtol * y[k].double().abs()
        r = (d / lim).max().item() if d.numel() else 0.0
        if r > worst:
            worst, where = r, k
    ok = worst <= 1.0
    print(f"  {'ok  ' if ok else 'FAIL'} {tag}: worst err/tol {worst:.3g} (at {where})")
    return ok


def selftest(device):
    ok = True
    torch.manual_seed(0)
    cfg = dict(CONFIGS["tiny"])
    params = init_params(cfg, seed=1)
    g = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), generator=g)
    targets = torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"]), generator=g)
    print(f"selftest on {device}: tiny config {cfg}")

    ref = run(params, tokens, targets, cfg, "composed", torch.float64, "cpu")
    print(f"  loss(float64, init weights) = {ref['loss'].item():.6f} (ln 256 = {math.log(256):.6f})")
    sd = run(params, tokens, targets, cfg, "sdpa", torch.float64, "cpu")
    ok &= _compare("cpu float64 composed vs sdpa", sd, ref, 1e-12, 1e-9)
    for attn in ("composed", "sdpa"):
        r = run(params, tokens, targets, cfg, attn, torch.float32, device)
        ok &= _compare(f"{device} float32 {attn} vs float64 composed", r, ref, 1e-5, 1e-3)
    cb = run(params, tokens, targets, cfg, "composed", torch.bfloat16, device)
    sb = run(params, tokens, targets, cfg, "sdpa", torch.bfloat16, device)
    dl = abs(cb["loss"].item() - ref["loss"].item()) + abs(sb["loss"].item() - ref["loss"].item())
    print(f"  {'ok  ' if dl < 0.05 else 'FAIL'} {device} bfloat16 loss composed {cb['loss'].item():.5f} "
          f"sdpa {sb['loss'].item():.5f} (float64 {ref['loss'].item():.5f})")
    ok &= dl < 0.05

    # gradcheck on a micro instance, float64, every parameter an input
    micro = dict(vocab=11, dim=8, layers=1, heads=2, head_dim=4, ffn=12, seq=5, batch=2)
    mp = init_params(micro, seed=3, dtype=torch.float64)
    gm = torch.Generator().manual_seed(4)
    for n in mp:  # perturb norms and scale up weights so every path matters
        mp[n] = mp[n] + 0.3 * torch.randn(mp[n].shape, generator=gm, dtype=torch.float64)
    mt = torch.randint(0, micro["vocab"], (micro["batch"], micro["seq"]), generator=gm)
    mg = torch.randint(0, micro["vocab"], (micro["batch"], micro["seq"]), generator=gm)
    names = list(mp)
    for attn in ("composed", "sdpa"):
        def f(*ts):
            return forward(dict(zip(names, ts)), mt, mg, micro, attn, torch.float64)[0]
        inputs = tuple(mp[n].clone().requires_grad_(True) for n in names)
        try:
            good = torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-5, rtol=1e-3)
        except Exception as e:  # gradcheck raises with details on failure
            print(f"  FAIL gradcheck {attn}: {str(e)[:300]}")
            good = False
        else:
            print(f"  ok   gradcheck float64 {attn} ({sum(t.numel() for t in inputs)} parameters)")
        ok &= good

    # CLI round trip through our safetensors files (config in metadata, and via --heads)
    with tempfile.TemporaryDirectory() as td:
        w, b, o, o2 = (os.path.join(td, n) for n in ("w.safetensors", "b.safetensors", "o.safetensors", "o2.safetensors"))
        st_io.write(w, params, {"config": json.dumps(cfg)})
        st_io.write(b, {"tokens": tokens, "targets": targets})
        main(["--weights", w, "--batch", b, "--out", o, "--device", "cpu", "--dtype", "float64"])
        main(["--weights", w, "--batch", b, "--out", o2, "--device", device, "--heads", "4", "--attn", "sdpa"])
        got, meta = st_io.read(o)
        ok &= _compare("CLI float64 output vs in-process", got, {k: v.float() if k != "loss" else v for k, v in ref.items()}, 1e-7, 1e-6)
        got2, _ = st_io.read(o2)
        ok &= _compare("CLI sdpa float32 output vs float64", got2, ref, 1e-5, 1e-3)
        bad = False
        try:
            main(["--weights", w, "--batch", b, "--out", o, "--device", "cpu", "--heads", "8"])
        except ValueError:
            bad = True
        print(f"  {'ok  ' if bad else 'FAIL'} --heads mismatch is rejected")
        ok &= bad
        try:
            import safetensors.torch as sft
        except ImportError:
            print("  skip compatibility with the safetensors package (not installed)")
        else:
            theirs = sft.load_file(w)
            same = all(torch.equal(theirs[k], params[k]) for k in params) and set(theirs) == set(params)
            p3 = os.path.join(td, "theirs.safetensors")
            sft.save_file({"a": torch.randn(3, 4).to(torch.bfloat16), "b": torch.arange(5)}, p3, {"x": "y"})
            back, m3 = st_io.read(p3)
            same &= back["b"].tolist() == list(range(5)) and m3 == {"x": "y"} and back["a"].dtype == torch.bfloat16
            print(f"  {'ok  ' if same else 'FAIL'} our files <-> safetensors package")
            ok &= same
    print("selftest", "PASSED" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
