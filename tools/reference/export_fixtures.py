#!/usr/bin/env python3
"""Exports small ONNX fixtures of attention written the usual ways (for the ONNX importer).

Usage (GPU machine; CPU is enough):
  python3 export_fixtures.py [--out-dir ../../onnx/testdata] [--only NAME,...] [--max-bytes 204800]

Models (seeded random weights; d_model 32, 2 heads, seq 8, batch 2):
  gpt2_block     nanoGPT-style block: LayerNorm, fused c_attn Linear split into q,k,v,
                 register_buffer("bias", tril(ones)), scores * (1/sqrt(d)),
                 masked_fill(bias[:,:,:T,:T] == 0, -inf), softmax, @ v, c_proj, GELU MLP.
  llama_block    2 LLaMA-style layers: RMSNorm, RoPE (rotate-half, cos/sin buffers),
                 additive causal mask built in forward with torch.triu(full(-inf), 1),
                 scores / sqrt(d), softmax in float then type_as, @ v, SwiGLU MLP.
  sdpa_block     F.scaled_dot_product_attention(q, k, v, is_causal=True) in a pre-LN block.
  flashgraph_tiny  the docs/MODEL.md transformer (torch_model.py), 1 layer, vocab 256:
                 inputs tokens/targets int64 [2, 8], outputs loss and logits; initializer
                 names are the MODEL.md parameter names.
Each is exported with the TorchScript exporter (dynamo=False, opset 17) and the dynamo
exporter (dynamo=True, opset 18; sdpa_block also at opset 23, where SDPA may map to Attention).
Files: <model>_<exporter><opset>.onnx (weights inside, no external data) and
<model>_<exporter><opset>.io.json:
  {"model", "exporter": "torchscript"|"dynamo", "opset", "torch", "onnx", "onnxruntime",
   "description", "ops": {op_type: count}, "max_abs_diff_vs_torch",
   "inputs": {name: {"dtype","shape","data"}}, "outputs": {name: {"dtype","shape","data"}}}
outputs are ONNX Runtime's (CPU EP) on those inputs. fixtures.json lists every attempt,
failures included (with the error). A summary of ops per model is printed.
"""
import argparse
import json
import math
import os
import sys
import traceback

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import check_onnx  # noqa: E402
import torch_model  # noqa: E402

D_MODEL, N_HEAD, SEQ, BATCH = 32, 2, 8, 2


# ------------------------------------------------------------------ (a) GPT-2 / nanoGPT
class GPT2Attention(nn.Module):
    def __init__(self, d, nh, block_size):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.n_head, self.n_embd = nh, d
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size))
                             .view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class GPT2Block(nn.Module):
    def __init__(self, d=D_MODEL, nh=N_HEAD, block_size=SEQ):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = GPT2Attention(d, nh, block_size)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


# ------------------------------------------------------------------ (b) LLaMA
class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class LlamaLayer(nn.Module):
    def __init__(self, d, nh, ffn):
        super().__init__()
        self.nh, self.hd = nh, d // nh
        self.input_layernorm = RMSNorm(d)
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)
        self.post_attention_layernorm = RMSNorm(d)
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.nh, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.nh, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.hd)
        mask = torch.full((T, T), float("-inf"), device=x.device)
        mask = torch.triu(mask, diagonal=1)
        scores = scores + mask
        probs = F.softmax(scores.float(), dim=-1).type_as(q)
        o = torch.matmul(probs, v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.o_proj(o)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class LlamaStack(nn.Module):
    def __init__(self, d=D_MODEL, nh=N_HEAD, ffn=64, layers=2, max_seq=SEQ, theta=10000.0):
        super().__init__()
        self.layers = nn.ModuleList([LlamaLayer(d, nh, ffn) for _ in range(layers)])
        self.norm = RMSNorm(d)
        hd = d // nh
        inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(max_seq).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def forward(self, x):
        T = x.shape[1]
        cos, sin = self.cos_cached[:T], self.sin_cached[:T]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


# ------------------------------------------------------------------ (c) SDPA
class SDPABlock(nn.Module):
    def __init__(self, d=D_MODEL, nh=N_HEAD):
        super().__init__()
        self.nh = nh
        self.ln_1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 4 * d)
        self.fc2 = nn.Linear(4 * d, d)

    def forward(self, x):
        B, T, C = x.shape
        qkv = self.qkv(self.ln_1(x)).view(B, T, 3, self.nh, C // self.nh).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.fc2(F.gelu(self.fc1(self.ln_2(x))))


# ------------------------------------------------------------------ (d) our MODEL.md model
FG_CFG = dict(vocab=256, dim=32, layers=1, heads=2, head_dim=16, ffn=64, seq=SEQ, batch=BATCH)


class FGLayer(nn.Module):
    def __init__(self, shapes, i):
        super().__init__()
        for p in torch_model.LAYER_PARAMS:
            setattr(self, p, nn.Parameter(shapes[f"layers.{i}.{p}"]))


class FlashgraphModel(nn.Module):
    def __init__(self, cfg=FG_CFG, seed=0):
        super().__init__()
        self.cfg = cfg
        p = torch_model.init_params(cfg, seed=seed)
        g = torch.Generator().manual_seed(seed + 1)
        for n in p:  # perturb the norms away from ones so the fixture exercises them
            if n.endswith("norm"):
                p[n] = p[n] + 0.1 * torch.randn(p[n].shape, generator=g)
        self.tok_emb = nn.Parameter(p["tok_emb"])
        self.layers = nn.ModuleList([FGLayer(p, i) for i in range(cfg["layers"])])
        self.final_norm = nn.Parameter(p["final_norm"])
        self.lm_head = nn.Parameter(p["lm_head"])

    def forward(self, tokens, targets):
        params = dict(self.named_parameters())
        return torch_model.forward(params, tokens, targets, self.cfg, "composed", torch.float32)


# ------------------------------------------------------------------ export machinery
def make_models():
    """name -> (module, inputs tuple, input names, output names, description)."""
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(BATCH, SEQ, D_MODEL, generator=g)
    models = {}
    torch.manual_seed(0)
    models["gpt2_block"] = (GPT2Block(), (x,), ["x"], ["y"], "nanoGPT block, masked_fill with tril buffer")
    torch.manual_seed(1)
    models["llama_block"] = (LlamaStack(), (x,), ["x"], ["y"], "2 LLaMA layers, triu additive mask, RoPE")
    torch.manual_seed(2)
    models["sdpa_block"] = (SDPABlock(), (x,), ["x"], ["y"], "F.scaled_dot_product_attention is_causal")
    tok = torch.randint(0, FG_CFG["vocab"], (BATCH, SEQ), generator=g)
    tgt = torch.randint(0, FG_CFG["vocab"], (BATCH, SEQ), generator=g)
    models["flashgraph_tiny"] = (FlashgraphModel(), (tok, tgt), ["tokens", "targets"], ["loss", "logits"],
                                 "docs/MODEL.md transformer, 1 layer, dim 32, 2 heads")
    for m in models.values():
        m[0].eval()
    return models


def export_torchscript(model, inputs, in_names, out_names, path, opset):
    torch.onnx.export(model, inputs, path, dynamo=False, opset_version=opset,
                      input_names=in_names, output_names=out_names, do_constant_folding=True)


def export_dynamo(model, inputs, in_names, out_names, path, opset):
    prog = torch.onnx.export(model, inputs, dynamo=True, opset_version=opset,
                             input_names=in_names, output_names=out_names)
    if prog is None:
        raise RuntimeError("dynamo export returned no program")
    try:
        prog.optimize()
    except Exception:  # noqa: BLE001 - optimisation is best effort (already done by default)
        pass
    try:
        prog.save(path, external_data=False)
    except TypeError:
        onnx.save_model(prog.model_proto, path, save_as_external_data=False)


def attempt(name, spec, exporter, opset, out_dir, max_bytes, versions):
    model, inputs, in_names, out_names, desc = spec
    base = f"{name}_{'ts' if exporter == 'torchscript' else 'dynamo'}{opset}"
    path = os.path.join(out_dir, base + ".onnx")
    rec = {"file": base + ".onnx", "model": name, "exporter": exporter, "opset": opset, "ok": False}
    try:
        with torch.no_grad():
            (export_torchscript if exporter == "torchscript" else export_dynamo)(
                model, inputs, in_names, out_names, path, opset)
        m = onnx.load(path)  # pulls in external data if an exporter wrote any
        for extra in os.listdir(out_dir):
            if extra.startswith(base + ".onnx") and extra != base + ".onnx":
                os.remove(os.path.join(out_dir, extra))  # e.g. base.onnx.data
        onnx.save_model(m, path, save_as_external_data=False)
        onnx.checker.check_model(path)
        rec["bytes"] = os.path.getsize(path)
        rec["ops"] = check_onnx.op_counts(m)
        rec["opsets"] = check_onnx.opsets(m)
        import onnxruntime as ort
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        feeds = {}
        graph_inputs = [i.name for i in sess.get_inputs()]
        for gi, (n, t) in zip(graph_inputs, zip(in_names, inputs)):
            feeds[gi] = t.numpy()
        if len(graph_inputs) != len(inputs):
            raise RuntimeError(f"graph inputs {graph_inputs} vs {in_names}")
        onames = [o.name for o in sess.get_outputs()]
        outs = dict(zip(onames, sess.run(onames, feeds)))
        with torch.no_grad():
            ref = model(*inputs)
        ref = ref if isinstance(ref, tuple) else (ref,)
        diff = max(float(np.max(np.abs(np.asarray(o, dtype=np.float64) - r.double().numpy())))
                   for o, r in zip(outs.values(), ref))
        rec["max_abs_diff_vs_torch"] = diff
        io = {"model": name, "exporter": exporter, "opset": opset, "description": desc, **versions,
              "ops": rec["ops"], "max_abs_diff_vs_torch": diff,
              "inputs": {k: check_onnx.tensor_to_json(v) for k, v in feeds.items()},
              "outputs": {k: check_onnx.tensor_to_json(v) for k, v in outs.items()}}
        with open(os.path.join(out_dir, base + ".io.json"), "w") as f:
            json.dump(io, f)
        rec["ok"] = diff < 1e-3
        if not rec["ok"]:
            rec["error"] = f"ONNX Runtime differs from torch by {diff}"
        if rec["bytes"] > max_bytes:
            rec["warning"] = f"{rec['bytes']} bytes > {max_bytes}"
    except Exception as e:  # noqa: BLE001 - record any exporter failure and go on
        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:600]
        rec["trace_tail"] = traceback.format_exc().strip().splitlines()[-3:]
        for extra in os.listdir(out_dir):
            if extra.startswith(base + ".") :
                os.remove(os.path.join(out_dir, extra))
    return rec


def main(argv=None):
    ap = argparse.ArgumentParser(description="export small ONNX attention fixtures")
    ap.add_argument("--out-dir", default=os.path.join(HERE, "..", "..", "onnx", "testdata"))
    ap.add_argument("--only", default="", help="comma-separated model names")
    ap.add_argument("--max-bytes", type=int, default=200 * 1024)
    a = ap.parse_args(argv)
    os.makedirs(a.out_dir, exist_ok=True)
    import onnxruntime
    versions = {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}
    try:
        import onnxscript
        versions["onnxscript"] = onnxscript.__version__
    except ImportError:
        versions["onnxscript"] = None
    print("versions:", json.dumps(versions))
    models = make_models()
    only = [s for s in a.only.split(",") if s]
    plan = [("torchscript", 17), ("dynamo", 18)]
    records = []
    for name, spec in models.items():
        if only and name not in only:
            continue
        for exporter, opset in plan + ([("dynamo", 23)] if name == "sdpa_block" else []):
            if exporter == "dynamo" and versions["onnxscript"] is None:
                records.append({"model": name, "exporter": exporter, "opset": opset, "ok": False,
                                "error": "skipped: onnxscript not installed"})
                continue
            rec = attempt(name, spec, exporter, opset, a.out_dir, a.max_bytes, versions)
            records.append(rec)
            status = "ok " if rec["ok"] else "ERR"
            print(f"[{status}] {name:16} {exporter:11} opset {opset}: "
                  + (f"{rec.get('bytes', 0):7d} B, diff {rec.get('max_abs_diff_vs_torch', float('nan')):.2e}"
                     if "bytes" in rec else "")
                  + (f" {rec['error']}" if rec.get("error") else "")
                  + (f" WARNING {rec['warning']}" if rec.get("warning") else ""))
            if rec.get("ops"):
                print("      ops: " + ", ".join(f"{k}×{v}" for k, v in rec["ops"].items()))
    with open(os.path.join(a.out_dir, "fixtures.json"), "w") as f:
        json.dump({"versions": versions, "fixtures": records}, f, indent=1)
    n_ok = sum(r["ok"] for r in records)
    print(f"{n_ok}/{len(records)} fixtures exported")
    return 0 if n_ok else 1


if __name__ == "__main__":
    sys.exit(main())
