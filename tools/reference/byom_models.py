"""Bring-your-own-model references: a GPT-2-style and a LLaMA-style model in
PyTorch, exported to ONNX, and trained here for a few steps on the same batches
that `flashgraph train FILE -loss next-token -data-order sequential` reads, so
the two loss curves compare step for step.

    python3 byom_models.py --out-dir ../../onnx/testdata/byom [--dynamo] [--steps 20]
        [--attn auto|explicit|sdpa] [--lr 1e-3] [--models gpt2,llama]
        [--device cpu|cuda] [--dtype float32|bfloat16] [--no-export]
    python3 byom_models.py --compare REF.losses.json CKPT.safetensors [--rtol 1e-4]
        [--noise OTHER.losses.json]

--compare reads the per-step losses a flashgraph checkpoint records (its
"losses" metadata, full precision) and compares them with PyTorch's: each
step within --rtol relative, or, with --noise (the same model trained by
PyTorch another way, e.g. float32 beside a bfloat16 REF), within the largest
|REF - OTHER| over the steps: the noise of the precision. Prints a table and
one JSON line; exit status 1 when a step is off.

Writes, per model M (gpt2_small, llama_gqa):
  M_ts17.onnx (TorchScript exporter, opset 17) or M_dynamo18.onnx (--dynamo,
  torch >= 2.5, opset 18), with the initial weights inside; "_sdpa" is added
  to the name when attention is F.scaled_dot_product_attention (torch >= 2.0;
  --attn explicit writes it out: GPT-2 masks with its tril buffer, LLaMA adds
  a triu -inf mask);
  M_TAG.losses.json (M_TAG.losses.DEVICE.DTYPE.json off float32 CPU): {"model", "losses": [step 1..N], "lr", "betas", "eps",
  "weight_decay", "batch", "seq", "data", "torch", "dtype", "device"}.
The batch source is data.txt in the output folder (written here when absent:
deterministic text, see make_corpus). Batches: step i (0-based) reads B
consecutive non-overlapping windows of S+1 tokens starting at token i*B*(S+1);
tokens are the first S of a window, targets the last S.

AdamW as flashgraph's train/ does it (autodiff.TrainingGraph, cmd_train.go):
betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on params of rank >= 2 only
(matrices and embedding tables; norm gains and biases not decayed), a constant
learning rate (flashgraph: -warmup 0 -min-lr-frac 1).
"""
import argparse
import inspect
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 256
BATCH, SEQ = 4, 16
BETAS, EPS, WD = (0.9, 0.95), 1e-8, 0.1


def has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


class GPT2Attention(nn.Module):
    """nanoGPT's CausalSelfAttention with its registered tril buffer."""

    def __init__(self, dim, heads, seq, sdpa):
        super().__init__()
        self.h, self.sdpa = heads, sdpa
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.register_buffer("bias", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.h, C // self.h).transpose(1, 2)
        k = k.view(B, T, self.h, C // self.h).transpose(1, 2)
        v = v.view(B, T, self.h, C // self.h).transpose(1, 2)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class GPT2Block(nn.Module):
    def __init__(self, dim, heads, seq, sdpa):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = GPT2Attention(dim, heads, seq, sdpa)
        self.ln_2 = nn.LayerNorm(dim)
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.c_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT2(nn.Module):
    def __init__(self, dim=32, layers=2, heads=4, seq=SEQ, sdpa=False):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, dim)
        self.wpe = nn.Embedding(seq, dim)
        self.h = nn.ModuleList([GPT2Block(dim, heads, seq, sdpa) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, VOCAB, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2 (one param, two uses)
        for n, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if n.endswith("c_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif n.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, input_ids):
        T = input_ids.shape[1]
        pos = torch.arange(T, dtype=torch.long, device=input_ids.device)
        x = self.wte(input_ids) + self.wpe(pos)
        for b in self.h:
            x = b(x)
        return self.lm_head(self.ln_f(x))


class RMSNorm(nn.Module):
    """LLaMA's RMSNorm: x * rsqrt(mean(x^2) + eps) * w, in float32."""

    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    """Hugging Face's repeat_kv: [B, KV, S, D] -> [B, KV*n_rep, S, D]."""
    b, kv, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, kv, n_rep, s, d).reshape(b, kv * n_rep, s, d)


class LlamaAttention(nn.Module):
    def __init__(self, dim, heads, kv_heads, sdpa):
        super().__init__()
        self.h, self.kv, self.d, self.sdpa = heads, kv_heads, dim // heads, sdpa
        self.q_proj = nn.Linear(dim, heads * self.d, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.d, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.d, bias=False)
        self.o_proj = nn.Linear(heads * self.d, dim, bias=False)

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv, self.d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = repeat_kv(k, self.h // self.kv)
        v = repeat_kv(v, self.h // self.kv)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.d)
            mask = torch.full((T, T), float("-inf"), device=x.device).triu(1)
            att = F.softmax(att + mask, dim=-1)
            y = torch.matmul(att, v)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.h * self.d))


class LlamaBlock(nn.Module):
    def __init__(self, dim, heads, kv_heads, ffn, sdpa):
        super().__init__()
        self.input_layernorm = RMSNorm(dim)
        self.self_attn = LlamaAttention(dim, heads, kv_heads, sdpa)
        self.post_attention_layernorm = RMSNorm(dim)
        self.gate_proj = nn.Linear(dim, ffn, bias=False)
        self.up_proj = nn.Linear(dim, ffn, bias=False)
        self.down_proj = nn.Linear(ffn, dim, bias=False)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class Llama(nn.Module):
    def __init__(self, dim=32, layers=2, heads=4, kv_heads=2, ffn=64, seq=SEQ, sdpa=False):
        super().__init__()
        self.embed_tokens = nn.Embedding(VOCAB, dim)
        self.layers = nn.ModuleList([LlamaBlock(dim, heads, kv_heads, ffn, sdpa) for _ in range(layers)])
        self.norm = RMSNorm(dim)
        self.lm_head = nn.Linear(dim, VOCAB, bias=False)
        d = dim // heads
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        f = torch.outer(torch.arange(seq, dtype=torch.float64), inv)
        emb = torch.cat((f, f), dim=-1)
        # RoPE tables: buffers (not params), computed in float64.
        self.register_buffer("cos_cached", emb.cos().float(), persistent=False)
        self.register_buffer("sin_cached", emb.sin().float(), persistent=False)
        for n, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if n.endswith(("o_proj.weight", "down_proj.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, input_ids):
        T = input_ids.shape[1]
        cos, sin = self.cos_cached[:T], self.sin_cached[:T]
        x = self.embed_tokens(input_ids)
        for b in self.layers:
            x = b(x, cos, sin)
        return self.lm_head(self.norm(x))


MODELS = {"gpt2": ("gpt2_small", GPT2), "llama": ("llama_gqa", Llama)}


def make_corpus(n):
    """n bytes of deterministic text: numbered lines of words from a small
    vocabulary picked by a 64-bit LCG (no randomness from torch)."""
    words = ["the", "graph", "fuses", "attention", "into", "one", "node", "and", "trains",
             "on", "bytes", "with", "adamw", "a", "kernel", "runs", "fast", "model", "loss", "step"]
    s, out, line = 12345, [], 0
    while sum(len(x) for x in out) < n:
        line += 1
        ws = []
        for _ in range(8):
            s = (s * 6364136223846793005 + 1442695040888963407) % (1 << 64)
            ws.append(words[(s >> 33) % len(words)])
        out.append("%d: %s.\n" % (line, " ".join(ws)))
    return "".join(out).encode()[:n]


def batches(data, steps, B, S):
    """Step i reads B consecutive windows of S+1 tokens from token i*B*(S+1)."""
    t = torch.tensor(list(data), dtype=torch.long)
    need = steps * B * (S + 1)
    if len(t) < need:
        raise SystemExit("data has %d tokens, %d steps of %dx%d need %d" % (len(t), steps, B, S + 1, need))
    for i in range(steps):
        w = t[i * B * (S + 1):(i + 1) * B * (S + 1)].view(B, S + 1)
        yield w[:, :-1].contiguous(), w[:, 1:].contiguous()


def export(model, path, dynamo):
    """Export for training: every parameter its own initializer under its
    PyTorch name. An eval-mode TorchScript export folds constants and merges
    initializers of equal value (all LayerNorm gains start at ones, all
    biases at zeros): the file then ties parameters that PyTorch trains
    apart, and no importer can tell them apart again."""
    x = torch.zeros(BATCH, SEQ, dtype=torch.long)
    if dynamo:
        prog = torch.onnx.export(model, (x,), dynamo=True, opset_version=18,
                                 input_names=["input_ids"], output_names=["logits"])
        prog.save(path)
    else:
        # torch >= 2.9 exports with dynamo unless told not to.
        extra = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
        torch.onnx.export(model, (x,), path, opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=["input_ids"], output_names=["logits"], **extra)


def train(model, data, steps, lr, device, dtype):
    model.to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=BETAS, eps=EPS, foreach=False)
    losses = []
    for tok, tgt in batches(data, steps, BATCH, SEQ):
        tok, tgt = tok.to(device), tgt.to(device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            logits = model(tok)
        loss = F.cross_entropy(logits.float().view(-1, VOCAB), tgt.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def read_ckpt_losses(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return [float(x) for x in json.loads(header["__metadata__"]["losses"])]


def compare(a):
    ref = json.load(open(a.compare[0]))
    ours = read_ckpt_losses(a.compare[1])
    want = ref["losses"]
    if len(ours) < len(want):
        raise SystemExit("the checkpoint has %d losses, the reference %d" % (len(ours), len(want)))
    noise = None
    if a.noise:
        other = json.load(open(a.noise))["losses"]
        noise = max(abs(x - y) for x, y in zip(want, other))
    worst, bad = 0.0, 0
    print("step  pytorch      flashgraph   rel")
    for i, (w, o) in enumerate(zip(want, ours)):
        rel = abs(o - w) / abs(w)
        worst = max(worst, rel)
        off = abs(o - w) > noise if noise is not None else rel > a.rtol
        bad += off
        print("%4d  %.7f  %.7f  %.2e%s" % (i + 1, w, o, rel, "  OFF" if off else ""))
    print(json.dumps({"ref": a.compare[0], "ckpt": a.compare[1], "steps": len(want), "max_rel": worst,
                      "rtol": None if noise is not None else a.rtol, "noise_abs": noise, "off": bad}))
    raise SystemExit(1 if bad else 0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", default="../../onnx/testdata/byom")
    ap.add_argument("--models", default="gpt2,llama")
    ap.add_argument("--dynamo", action="store_true", help="torch.onnx dynamo exporter, opset 18 (torch >= 2.5)")
    ap.add_argument("--attn", choices=["auto", "explicit", "sdpa"], default="auto",
                    help="attention as written: auto = SDPA when torch has it")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--no-export", action="store_true", help="train only (e.g. rerun for the bf16 noise)")
    ap.add_argument("--compare", nargs=2, metavar=("REF_JSON", "CKPT"))
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--noise", metavar="OTHER_JSON")
    a = ap.parse_args()
    if a.compare:
        return compare(a)
    torch.set_num_threads(1)
    os.makedirs(a.out_dir, exist_ok=True)
    data_path = os.path.join(a.out_dir, "data.txt")
    if not os.path.exists(data_path):
        with open(data_path, "wb") as f:
            f.write(make_corpus(2 * a.steps * BATCH * (SEQ + 1) + 1024))
    data = open(data_path, "rb").read()
    sdpa = has_sdpa() if a.attn == "auto" else a.attn == "sdpa"
    tag = ("dynamo18" if a.dynamo else "ts17") + ("_sdpa" if sdpa else "")
    for key in a.models.split(","):
        name, cls = MODELS[key]
        torch.manual_seed(a.seed)
        model = cls(sdpa=sdpa)
        onnx_path = os.path.join(a.out_dir, "%s_%s.onnx" % (name, tag))
        if not a.no_export:
            export(model, onnx_path, a.dynamo)
        losses = train(model, data, a.steps, a.lr, a.device, a.dtype)
        rec = {"model": name, "onnx": os.path.basename(onnx_path), "attn": "sdpa" if sdpa else "explicit",
               "losses": losses, "lr": a.lr, "betas": list(BETAS), "eps": EPS, "weight_decay": WD,
               "decay": "rank >= 2", "batch": BATCH, "seq": SEQ, "data": "data.txt",
               "data_order": "sequential", "seed": a.seed, "torch": torch.__version__,
               "dtype": a.dtype, "device": a.device}
        suffix = "" if (a.dtype, a.device) == ("float32", "cpu") else ".%s.%s" % (a.device, a.dtype)
        with open(os.path.join(a.out_dir, "%s_%s.losses%s.json" % (name, tag, suffix)), "w") as f:
            json.dump(rec, f, indent=1)
        print(json.dumps({"model": name, "onnx": onnx_path, "first": losses[0], "last": losses[-1]}))


if __name__ == "__main__":
    main()
