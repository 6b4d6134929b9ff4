"""Minimal safetensors reader/writer on top of torch (no `safetensors` package needed).

Format: 8-byte little-endian u64 N, then N bytes of JSON header
{name: {"dtype": "F32", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {str: str}},
then the raw little-endian data; offsets are relative to the end of the header.
"""
import json
import struct

import torch

_TO_TORCH = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
}
_FROM_TORCH = {v: k for k, v in _TO_TORCH.items()}


def read(path):
    """Returns (tensors: dict name -> CPU tensor, metadata: dict str -> str)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} past end of file")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", None) or {}
    base = 8 + n
    out = {}
    for name, info in header.items():
        dt = _TO_TORCH.get(info["dtype"])
        if dt is None:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {info['dtype']}")
        shape = [int(s) for s in info["shape"]]
        b, e = info["data_offsets"]
        numel = 1
        for s in shape:
            numel *= s
        want = numel * torch.tensor([], dtype=dt).element_size()
        if e - b != want or base + e > len(data):
            raise ValueError(f"{path}: tensor {name}: bad data_offsets {b},{e} for shape {shape}")
        if numel == 0:
            out[name] = torch.empty(shape, dtype=dt)
            continue
        buf = bytearray(data[base + b:base + e])
        out[name] = torch.frombuffer(buf, dtype=dt).reshape(shape)
    return out, meta


def _tensor_bytes(t):
    t = t.detach().to("cpu").contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def write(path, tensors, metadata=None):
    """Writes dict name -> tensor (sorted by name) with optional str->str metadata."""
    header = {}
    blobs = []
    off = 0
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype not in _FROM_TORCH:
            raise ValueError(f"tensor {name}: unsupported dtype {t.dtype}")
        b = _tensor_bytes(t)
        header[name] = {"dtype": _FROM_TORCH[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)  # pad so the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
