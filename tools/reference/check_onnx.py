#!/usr/bin/env python3
"""Checks an ONNX file and runs it with ONNX Runtime (CPU execution provider).

Usage:
  python3 check_onnx.py FILE.onnx [IO.json|REF.safetensors] [--dump OUT.io.json] [--atol 1e-4]
                        [--rtol 1e-3] [--seed 0] [--dim 1] [--int-high 2] [--full]

Steps: onnx.checker.check_model (with full_check: strict shape inference; a failure of the
strict check alone is reported as a warning), a count of the ops used, a run on ONNX Runtime.
Inputs come from IO.json when given, else are random (floats N(0,1), integers in
[0, --int-high), symbolic dimensions set to --dim). When IO.json has "outputs", each ONNX
Runtime output is compared with it: ok when |got - want| <= atol + rtol·|want| everywhere.

Prints one JSON object to stdout:
  {"file", "checker": "ok"|error, "strict_checker": "ok"|error, "opset": {domain: version},
   "ops": {op_type: count}, "inputs": {name: {"dtype","shape"}},
   "outputs": {name: {"dtype","shape","min","max","mean", "data" (when --full or <= 64 values)}},
   "compare": {name: {"max_abs_diff", "ok"}} (only with IO.json outputs), "ok": bool}
Exit status 0 when the checker passed and every compared output matched, else 1.

IO.json format (also what --dump writes, and what export_fixtures.py writes):
  {"inputs":  {name: {"dtype": "float32"|"int64"|..., "shape": [...], "data": [flat, row-major]}},
   "outputs": {name: {...same...}}, ...any other keys are ignored}

REF.safetensors (what `flashgraph export -ckpt DIR -o model.onnx -reference REF.safetensors`
writes): tensors "input.NAME" (the feeds) and "output.NAME" (flashgraph's outputs on the CPU
from the checkpoint's weights); read here with numpy alone.
"""
import argparse
import collections
import json
import sys

import numpy as np
import onnx


def tensor_to_json(a):
    a = np.asarray(a)
    if a.dtype.kind == "f":
        data = [float(f"{v:.9g}") for v in a.astype(np.float64).reshape(-1).tolist()]
    elif a.dtype.kind == "b":
        data = [bool(v) for v in a.reshape(-1).tolist()]
    else:
        data = [int(v) for v in a.reshape(-1).tolist()]
    return {"dtype": str(a.dtype), "shape": list(a.shape), "data": data}


def tensor_from_json(d):
    return np.asarray(d["data"], dtype=np.dtype(d["dtype"])).reshape(d["shape"])


_ST_TO_NP = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
    "BOOL": np.bool_, "U8": np.uint8, "I8": np.int8,
}


def read_reference(path):
    """A safetensors file of input.NAME / output.NAME tensors as an IO dict of numpy arrays."""
    import struct
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise SystemExit(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise SystemExit(f"{path}: header length {n} past the end of the file")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    io = {"inputs": {}, "outputs": {}}
    for name, info in header.items():
        dt = _ST_TO_NP.get(info["dtype"])
        if dt is None:
            raise SystemExit(f"{path}: tensor {name}: unsupported dtype {info['dtype']}")
        b, e = info["data_offsets"]
        a = np.frombuffer(data[8 + n + b:8 + n + e], dtype=np.dtype(dt).newbyteorder("<"))
        a = a.astype(dt).reshape([int(d) for d in info["shape"]])
        kind, _, key = name.partition(".")
        if kind == "input":
            io["inputs"][key] = a
        elif kind == "output":
            io["outputs"][key] = a
    return io


def op_counts(model):
    c = collections.Counter()
    for n in model.graph.node:
        c[(n.domain + "::" if n.domain and n.domain != "ai.onnx" else "") + n.op_type] += 1
    # model-local functions (the dynamo exporter can emit them): count their bodies too
    for f in model.functions:
        for n in f.node:
            c[f"{f.name}/{n.op_type}"] += 1
    return dict(sorted(c.items()))


def opsets(model):
    return {(o.domain or "ai.onnx"): o.version for o in model.opset_import}


_ONNX_TO_NP = {
    "tensor(float)": np.float32, "tensor(double)": np.float64, "tensor(float16)": np.float16,
    "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(bool)": np.bool_,
    "tensor(uint8)": np.uint8, "tensor(int8)": np.int8,
}


def random_inputs(sess, seed, dim, int_high):
    rng = np.random.default_rng(seed)
    feeds = {}
    for i in sess.get_inputs():
        shape = [s if isinstance(s, int) and s > 0 else dim for s in i.shape]
        dt = _ONNX_TO_NP.get(i.type)
        if dt is None:
            raise SystemExit(f"input {i.name}: cannot make random data of type {i.type}")
        if np.dtype(dt).kind == "f":
            feeds[i.name] = rng.standard_normal(shape).astype(dt)
        elif np.dtype(dt).kind == "b":
            feeds[i.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[i.name] = rng.integers(0, int_high, shape).astype(dt)
    return feeds


def run_ort(path, feeds):
    import onnxruntime as ort
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def main(argv=None):
    ap = argparse.ArgumentParser(description="onnx.checker + ONNX Runtime run of one model")
    ap.add_argument("model")
    ap.add_argument("io", nargs="?", help="inputs (and expected outputs): IO.json, or a .safetensors of input.NAME/output.NAME (flashgraph export -reference)")
    ap.add_argument("--dump", help="write inputs and outputs here as IO.json")
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--rtol", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dim", type=int, default=1, help="value for symbolic dimensions")
    ap.add_argument("--int-high", type=int, default=2, help="random integer inputs are in [0, this)")
    ap.add_argument("--full", action="store_true", help="print every output value")
    a = ap.parse_args(argv)

    rep = {"file": a.model}
    ok = True
    try:
        onnx.checker.check_model(a.model)
        rep["checker"] = "ok"
    except Exception as e:  # noqa: BLE001 - report whatever the checker says
        rep["checker"] = f"{type(e).__name__}: {e}"[:1000]
        ok = False
    try:
        onnx.checker.check_model(a.model, full_check=True)
        rep["strict_checker"] = "ok"
    except Exception as e:  # noqa: BLE001
        rep["strict_checker"] = f"{type(e).__name__}: {e}"[:1000]
    model = onnx.load(a.model)
    rep["opset"] = opsets(model)
    rep["ops"] = op_counts(model)

    io = None
    if a.io and a.io.endswith(".safetensors"):
        io = read_reference(a.io)
        feeds = dict(io["inputs"])
    elif a.io:
        with open(a.io) as f:
            io = json.load(f)
        feeds = {k: tensor_from_json(v) for k, v in io["inputs"].items()}
    else:
        import onnxruntime as ort
        feeds = random_inputs(ort.InferenceSession(a.model, providers=["CPUExecutionProvider"]),
                              a.seed, a.dim, a.int_high)
    rep["inputs"] = {k: {"dtype": str(v.dtype), "shape": list(v.shape)} for k, v in feeds.items()}
    try:
        outs = run_ort(a.model, feeds)
    except Exception as e:  # noqa: BLE001
        rep["run"] = f"{type(e).__name__}: {e}"[:1000]
        rep["ok"] = False
        print(json.dumps(rep, indent=1))
        return 1
    rep["outputs"] = {}
    for k, v in outs.items():
        v = np.asarray(v)
        r = {"dtype": str(v.dtype), "shape": list(v.shape)}
        if v.size and v.dtype.kind in "fiub":
            vf = v.astype(np.float64)
            r.update(min=float(vf.min()), max=float(vf.max()), mean=float(vf.mean()))
        if a.full or v.size <= 64:
            r["data"] = tensor_to_json(v)["data"]
        rep["outputs"][k] = r
    if io and io.get("outputs"):
        rep["compare"] = {}
        for k, want in io["outputs"].items():
            if k not in outs:
                rep["compare"][k] = {"ok": False, "error": "no such output"}
                ok = False
                continue
            w = (want if isinstance(want, np.ndarray) else tensor_from_json(want)).astype(np.float64)
            g = np.asarray(outs[k]).astype(np.float64)
            if w.shape != g.shape:
                rep["compare"][k] = {"ok": False, "error": f"shape {list(g.shape)} != {list(w.shape)}"}
                ok = False
                continue
            d = np.abs(g - w)
            good = bool(np.all((d <= a.atol + a.rtol * np.abs(w)) | (np.isinf(w) & (g == w))))
            rep["compare"][k] = {"max_abs_diff": float(np.nanmax(d)) if d.size else 0.0, "ok": good}
            ok &= good
    if a.dump:
        with open(a.dump, "w") as f:
            json.dump({"model": a.model,
                       "inputs": {k: tensor_to_json(v) for k, v in feeds.items()},
                       "outputs": {k: tensor_to_json(v) for k, v in outs.items()}}, f)
    rep["ok"] = ok
    print(json.dumps(rep, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
