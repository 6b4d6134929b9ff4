#!/usr/bin/env python3
"""Greedy text generation with the docs/MODEL.md transformer in PyTorch, from a flashgraph
training checkpoint: the reference `flashgraph generate` is compared with, token for token.

Usage (from tools/reference/):
  python3 generate.py --ckpt CKPT [--prompt TEXT] [--max-new N] [--dtype float32|float64]
      [--attn composed|sdpa] [--device cuda|cpu]

CKPT is a checkpoint file (step-XXXXXXXX.safetensors) or a folder (its newest checkpoint).
Every step recomputes the whole sequence (no KV cache: the simplest correct decoder) and takes
the argmax of the last position's logits (ties to the lowest id, like ours). stdout gets exactly
what `flashgraph generate -temperature 0` prints: the prompt, the new bytes and a newline, so
the two outputs compare with `cmp`. A JSON summary goes to stderr.
"""
import argparse
import json
import os
import sys

import torch

import st_io
import torch_model as tm


def newest_checkpoint(path):
    if not os.path.isdir(path):
        return path
    names = sorted(n for n in os.listdir(path) if n.startswith("step-") and n.endswith(".safetensors"))
    if not names:
        raise SystemExit(f"{path}: no checkpoint in the folder")
    return os.path.join(path, names[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--prompt", default="\n")
    ap.add_argument("--max-new", type=int, default=0, help="0: up to the end of the context")
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    ap.add_argument("--attn", choices=["composed", "sdpa"], default="composed")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    a = ap.parse_args(argv)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    path = newest_checkpoint(a.ckpt)
    tensors, meta = st_io.read(path)
    ours = json.loads(meta["config"])  # model.Config: Name, Vocab, Dim, ..., Seq
    names = tm.param_names(ours["Layers"])
    params = {n: tensors[n] for n in names}
    cfg = tm.infer_config(params)
    if cfg["heads"] != ours["Heads"]:
        raise SystemExit(f"checkpoint says {ours['Heads']} heads, the shapes {cfg['heads']}")
    dtype = tm.DTYPES[a.dtype]
    params = {k: v.to(device=device, dtype=dtype) for k, v in params.items()}
    prompt = list(a.prompt.encode())
    n = a.max_new or ours["Seq"] - len(prompt) + 1
    if len(prompt) + n - 1 > ours["Seq"]:
        raise SystemExit(f"prompt {len(prompt)} + {n} new bytes exceed the context {ours['Seq']}")
    seq = torch.tensor([prompt], dtype=torch.int64, device=device)
    new = []
    with torch.no_grad():
        for _ in range(n):
            _, logits = tm.forward(params, seq, torch.zeros_like(seq), cfg, a.attn, dtype)
            nxt = int(torch.argmax(logits[0, -1]).item())  # first maximum: lowest id on ties
            new.append(nxt)
            seq = torch.cat([seq, torch.tensor([[nxt]], device=device)], 1)
    sys.stdout.buffer.write(bytes(prompt) + bytes(new) + b"\n")
    sys.stdout.flush()
    print(json.dumps({"checkpoint": path, "config": ours["Name"], "dtype": a.dtype, "attn": a.attn,
                      "device": device, "prompt_tokens": len(prompt), "new_tokens": new}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
