#!/usr/bin/env python3
"""Exports small ONNX fixtures of attention written the usual ways (for the ONNX importer).

Usage (GPU machine; CPU is enough):
  python3 export_fixtures.py [--out-dir ../../onnx/testdata] [--only NAME,...] [--max-bytes 204800]

Usage for every fixture, from this folder (CPU only, about a minute):
  python3 export_fixtures.py --out-dir ../../onnx/testdata

Models (seeded random weights; d_model 32, 2 heads, seq 8, batch 2 unless said):
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
  llama_gqa_block  1 LLaMA layer + final norm with grouped-query attention (4 heads, 2 kv heads,
                 head_dim 8; repeat_kv as Hugging Face writes it: [:, :, None] expand + reshape),
                 RoPE, torch.nn.RMSNorm, triu additive causal mask, SwiGLU MLP.
  bert_encoder   post-LN BERT encoder layer: inputs x f32 [2, 8, 32] and attention_mask int64
                 [2, 8] (row 1 ends in 3 padding zeros); additive mask (1 - mask) * finfo.min,
                 non-causal attention, LayerNorm, GELU (erf) MLP.
  mistral_block  llama_gqa_block with a sliding-window causal mask (window 4 < seq 8):
                 triu(full(-inf), 1) + tril(full(-inf), -4), built in forward.
Each is exported with the TorchScript exporter (dynamo=False, opset 17) and the dynamo
exporter (dynamo=True) at opsets 18 and 23 (at 23 SDPA may map to Attention and nn.RMSNorm to
RMSNormalization); flashgraph_tiny only at ts17 and dynamo18. For the models with nn.RMSNorm,
an exporter that cannot export it (the TorchScript one has no aten::rms_norm below opset 23)
gets the same model with RMSNorm written out; the record says which ("rmsnorm",
"rmsnorm_op": whether an RMSNormalization op appears, "rmsnorm_module_error").
Files: <model>_<exporter><opset>.onnx (weights inside, no external data) and
<model>_<exporter><opset>.io.json:
  {"model", "exporter": "torchscript"|"dynamo", "opset", "torch", "onnx", "onnxruntime",
   "description", "ops": {op_type: count}, "max_abs_diff_vs_torch",
   "inputs": {name: {"dtype","shape","data"}}, "outputs": {name: {"dtype","shape","data"}}}
outputs are ONNX Runtime's (CPU EP) on those inputs. fixtures.json lists every attempt,
failures included (with the error), each with "expect", what the importer should do with its
attention: "fuse" (every attention becomes FlashAttention) or "unfused: <reason>" (import it,
leave the attention unfused, and name the reason: "sliding window", "padding mask").
With --only, fixtures.json keeps the other models' records. A summary of ops per model is printed.
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


# ------------------------------------------------------------------ (e) LLaMA with GQA, (f) Mistral
class RMSNormModule(nn.RMSNorm):
    """torch.nn.RMSNorm (F.rms_norm; the dynamo exporter at opset 23 may emit RMSNormalization).

    decomposed=True computes the same thing from pow/mean/rsqrt, for exporters that have no
    aten::rms_norm (the TorchScript exporter below opset 23); the parameters are the same."""
    decomposed = False

    def forward(self, x):
        if not self.decomposed:
            return super().forward(x)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def repeat_kv(x, n_rep):
    """[B, n_kv, S, D] -> [B, n_kv*n_rep, S, D], written as Hugging Face's LLaMA does."""
    b, n_kv, s, d = x.shape
    if n_rep == 1:
        return x
    x = x[:, :, None, :, :].expand(b, n_kv, n_rep, s, d)
    return x.reshape(b, n_kv * n_rep, s, d)


class GQALayer(nn.Module):
    """LLaMA/Mistral decoder layer: grouped-query attention written out (matmul, scale, mask,
    softmax, matmul); window=None is causal, window=W also masks keys W or more positions back."""

    def __init__(self, d, nh, nkv, ffn, window=None):
        super().__init__()
        self.nh, self.nkv, self.hd, self.window = nh, nkv, d // nh, window
        self.input_layernorm = RMSNormModule(d, eps=1e-5)
        self.q_proj = nn.Linear(d, nh * self.hd, bias=False)
        self.k_proj = nn.Linear(d, nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(d, nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(nh * self.hd, d, bias=False)
        self.post_attention_layernorm = RMSNormModule(d, eps=1e-5)
        self.gate_proj = nn.Linear(d, ffn, bias=False)
        self.up_proj = nn.Linear(d, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, d, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        h = self.input_layernorm(x)
        q = self.q_proj(h).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(h).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = repeat_kv(k, self.nh // self.nkv)
        v = repeat_kv(v, self.nh // self.nkv)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.hd)
        mask = torch.triu(torch.full((T, T), float("-inf"), device=x.device), diagonal=1)
        if self.window is not None:  # Mistral: key j is visible to query i only if i-W < j <= i
            mask = mask + torch.tril(torch.full((T, T), float("-inf"), device=x.device),
                                     diagonal=-self.window)
        scores = scores + mask
        probs = F.softmax(scores.float(), dim=-1).type_as(q)
        o = torch.matmul(probs, v).transpose(1, 2).contiguous().view(B, T, self.nh * self.hd)
        x = x + self.o_proj(o)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class GQAStack(nn.Module):
    def __init__(self, d=D_MODEL, nh=4, nkv=2, ffn=64, layers=1, max_seq=SEQ, theta=10000.0,
                 window=None):
        super().__init__()
        self.layers = nn.ModuleList([GQALayer(d, nh, nkv, ffn, window) for _ in range(layers)])
        self.norm = RMSNormModule(d, eps=1e-5)
        with torch.no_grad():  # norm weights away from ones so the fixture exercises them
            for m in self.modules():
                if isinstance(m, RMSNormModule):
                    m.weight.add_(0.1 * torch.randn(m.weight.shape))
        hd = d // nh
        inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2).float() / hd))
        freqs = torch.outer(torch.arange(max_seq).float(), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos_cached", emb.cos(), persistent=False)
        self.register_buffer("sin_cached", emb.sin(), persistent=False)

    def set_rmsnorm(self, decomposed):
        for m in self.modules():
            if isinstance(m, RMSNormModule):
                m.decomposed = decomposed

    def forward(self, x):
        T = x.shape[1]
        cos, sin = self.cos_cached[:T], self.sin_cached[:T]
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)


# ------------------------------------------------------------------ (g) BERT encoder layer
class BertLayer(nn.Module):
    """Post-LN encoder layer: non-causal attention with the additive padding mask that BERT
    builds from attention_mask ((1 - mask) * finfo.min), GELU (erf) MLP."""

    def __init__(self, d=D_MODEL, nh=N_HEAD, ffn=4 * D_MODEL):
        super().__init__()
        self.nh, self.hd = nh, d // nh
        self.query = nn.Linear(d, d)
        self.key = nn.Linear(d, d)
        self.value = nn.Linear(d, d)
        self.attn_out = nn.Linear(d, d)
        self.attn_ln = nn.LayerNorm(d, eps=1e-12)
        self.intermediate = nn.Linear(d, ffn)
        self.output = nn.Linear(ffn, d)
        self.out_ln = nn.LayerNorm(d, eps=1e-12)

    def forward(self, x, attention_mask):
        B, T, C = x.shape
        ext = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        q = self.query(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.key(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        v = self.value(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hd) + ext
        probs = F.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous().view(B, T, C)
        x = self.attn_ln(x + self.attn_out(ctx))
        return self.out_ln(x + self.output(F.gelu(self.intermediate(x))))


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
    # New models draw from their own generator, so the ones above keep their inputs and weights.
    g2 = torch.Generator().manual_seed(4321)
    x2 = torch.randn(BATCH, SEQ, D_MODEL, generator=g2)
    torch.manual_seed(3)
    models["llama_gqa_block"] = (GQAStack(), (x2,), ["x"], ["y"],
                                 "1 LLaMA layer + final norm: GQA 4 heads / 2 kv heads (repeat_kv expand+reshape), "
                                 "RoPE, nn.RMSNorm, triu additive causal mask, SwiGLU")
    torch.manual_seed(4)
    attention_mask = torch.ones(BATCH, SEQ, dtype=torch.int64)
    attention_mask[1, SEQ - 3:] = 0  # second row: 3 trailing padding tokens
    models["bert_encoder"] = (BertLayer(), (x2, attention_mask), ["x", "attention_mask"], ["y"],
                              "post-LN BERT encoder layer, non-causal attention + additive padding mask "
                              "from attention_mask int64 [B,S], GELU (erf) MLP")
    torch.manual_seed(5)
    models["mistral_block"] = (GQAStack(window=WINDOW), (x2,), ["x"], ["y"],
                               f"1 Mistral layer + final norm: as llama_gqa_block with a sliding-window "
                               f"causal mask (window {WINDOW} < seq {SEQ}: triu + tril(-{WINDOW}) of -inf)")
    for m in models.values():
        m[0].eval()
    return models


WINDOW = 4
# Export plan and what the importer should do with each model's attention (fixtures.json
# "expect"): "fuse" (every attention becomes FlashAttention) or "unfused: <reason>" (the importer
# must import it, leave the attention unfused and name the reason).
ALL3 = [("torchscript", 17), ("dynamo", 18), ("dynamo", 23)]
PLANS = {"gpt2_block": ALL3, "llama_block": ALL3, "sdpa_block": ALL3,
         "flashgraph_tiny": [("torchscript", 17), ("dynamo", 18)],
         "llama_gqa_block": ALL3, "bert_encoder": ALL3, "mistral_block": ALL3}
EXPECT = {"bert_encoder": "unfused: padding mask",  # FlashAttention has no mask input (today)
          "mistral_block": "unfused: sliding window"}


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


def fixture_base(name, exporter, opset):
    return f"{name}_{'ts' if exporter == 'torchscript' else 'dynamo'}{opset}"


def attempt_rmsnorm(name, spec, exporter, opset, out_dir, max_bytes, versions):
    """attempt() for models with RMSNormModule: nn.RMSNorm first; if that fails before the
    comparison with torch (export, checker or ONNX Runtime), the same model with RMSNorm
    written out (the first error is kept in the record)."""
    model = spec[0]
    model.set_rmsnorm(False)
    rec = attempt(name, spec, exporter, opset, out_dir, max_bytes, versions)
    rec["rmsnorm"] = "nn.RMSNorm"
    if "max_abs_diff_vs_torch" not in rec:
        first = rec
        model.set_rmsnorm(True)
        desc = spec[4] + " (RMSNorm written out as pow, mean, rsqrt: nn.RMSNorm did not export)"
        try:
            rec = attempt(name, spec[:4] + (desc,), exporter, opset, out_dir, max_bytes, versions)
        finally:
            model.set_rmsnorm(False)
        rec["rmsnorm"] = "decomposed (pow, mean, rsqrt)"
        rec["rmsnorm_module_error"] = first.get("error")
    rec["rmsnorm_op"] = any(k.endswith("RMSNormalization") for k in rec.get("ops", {}))
    return rec


def attempt(name, spec, exporter, opset, out_dir, max_bytes, versions):
    model, inputs, in_names, out_names, desc = spec
    base = fixture_base(name, exporter, opset)
    path = os.path.join(out_dir, base + ".onnx")
    rec = {"file": base + ".onnx", "model": name, "exporter": exporter, "opset": opset,
           "expect": EXPECT.get(name, "fuse"), "ok": False}
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
    unknown = [n for n in only if n not in models]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {', '.join(models)}")
    records = []
    for name, spec in models.items():
        if only and name not in only:
            continue
        for exporter, opset in PLANS[name]:
            if exporter == "dynamo" and versions["onnxscript"] is None:
                records.append({"file": fixture_base(name, exporter, opset) + ".onnx", "model": name,
                                "exporter": exporter, "opset": opset, "expect": EXPECT.get(name, "fuse"),
                                "ok": False, "error": "skipped: onnxscript not installed"})
                continue
            run = attempt_rmsnorm if isinstance(spec[0], GQAStack) else attempt
            rec = run(name, spec, exporter, opset, a.out_dir, a.max_bytes, versions)
            records.append(rec)
            status = "ok " if rec["ok"] else "ERR"
            print(f"[{status}] {name:16} {exporter:11} opset {opset}: "
                  + (f"{rec.get('bytes', 0):7d} B, diff {rec.get('max_abs_diff_vs_torch', float('nan')):.2e}"
                     if "bytes" in rec else "")
                  + (f" {rec['error']}" if rec.get("error") else "")
                  + (f" WARNING {rec['warning']}" if rec.get("warning") else ""))
            if rec.get("ops"):
                print("      ops: " + ", ".join(f"{k}×{v}" for k, v in rec["ops"].items()))
            if "rmsnorm" in rec:
                print(f"      rmsnorm: {rec['rmsnorm']}, RMSNormalization op: {rec['rmsnorm_op']}"
                      + (f" (nn.RMSNorm failed: {rec['rmsnorm_module_error']})"
                         if rec.get("rmsnorm_module_error") else ""))
            print(f"      expect: {rec['expect']}")
    index = os.path.join(a.out_dir, "fixtures.json")
    if only and os.path.exists(index):  # --only: keep the other models' records
        with open(index) as f:
            kept = [r for r in json.load(f).get("fixtures", []) if r.get("model") not in only]
        for r in kept:
            r.setdefault("expect", EXPECT.get(r.get("model"), "fuse"))
        records = kept + records
    with open(index, "w") as f:
        json.dump({"versions": versions, "fixtures": records}, f, indent=1)
    n_ok = sum(r["ok"] for r in records)
    print(f"{n_ok}/{len(records)} fixtures exported")
    return 0 if n_ok else 1


if __name__ == "__main__":
    sys.exit(main())
