"""safetensors_np.py: a numpy-only reader and writer of safetensors files and model directories.

Shared by the reference (hyla_ref.py), the tiny-model writer (make_tiny.py) and the CI
comparison (compare_fixture.py, which must not need torch). Format: u64 little-endian header
length, a JSON header {name: {dtype, shape, data_offsets}}, then the raw little-endian data.
"""
import hashlib
import json
import os
import struct

import numpy as np

_DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"),
           "BF16": np.dtype("<u2")}


def read_safetensors(path):
    """Returns {name: numpy float32 (float64 for F64) array} of one .safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError("%s: too short for a safetensors header" % path)
    (hlen,) = struct.unpack("<Q", raw[:8])
    if 8 + hlen > len(raw):
        raise ValueError("%s: header length %d beyond end of file" % (path, hlen))
    header = json.loads(raw[8:8 + hlen].decode("utf-8"))
    base = 8 + hlen
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dt = info["dtype"]
        if dt not in _DTYPES:
            raise ValueError("%s: tensor %r has dtype %s (want F32, F16, BF16)" % (path, name, dt))
        b, e = info["data_offsets"]
        shape = tuple(info["shape"])
        npdt = _DTYPES[dt]
        n = int(np.prod(shape)) if shape else 1
        if e - b != n * npdt.itemsize or base + e > len(raw):
            raise ValueError("%s: tensor %r: bad data_offsets %s for shape %s"
                             % (path, name, info["data_offsets"], list(shape)))
        a = np.frombuffer(raw, dtype=npdt, count=n, offset=base + b)
        if dt == "BF16":
            a = (a.astype(np.uint32) << 16).view(np.float32)
        elif dt == "F16":
            a = a.astype(np.float32)
        out[name] = a.reshape(shape).copy()
    return out


def load_model_dir(d):
    """Returns (config dict, {tensor name: numpy array}) of a model directory (one file or a
    sharded model.safetensors.index.json)."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    idx = os.path.join(d, "model.safetensors.index.json")
    weights = {}
    if os.path.exists(idx):
        with open(idx) as f:
            wm = json.load(f)["weight_map"]
        for fn in sorted(set(wm.values())):
            weights.update(read_safetensors(os.path.join(d, fn)))
    else:
        weights = read_safetensors(os.path.join(d, "model.safetensors"))
    return cfg, weights


def weights_digest(weights):
    """sha256 over (name, shape, float32 values) in name order: identifies a model's weights
    independently of file layout, dtype container order or sharding."""
    h = hashlib.sha256()
    for n in sorted(weights):
        a = np.ascontiguousarray(weights[n], dtype="<f4")
        h.update(n.encode() + b"\0" + json.dumps(list(a.shape)).encode() + b"\0")
        h.update(a.tobytes())
    return h.hexdigest()


def _to_bytes(a, dtype):
    a = np.ascontiguousarray(a, dtype=np.float32)
    if dtype == "F32":
        return a.astype("<f4").tobytes()
    if dtype == "F16":
        return a.astype("<f2").tobytes()
    if dtype == "BF16":  # round to nearest even
        u = a.view(np.uint32).astype(np.uint64)
        u = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return u.astype("<u2").tobytes()
    raise ValueError(dtype)


def write_safetensors(path, tensors, dtype):
    """tensors: [(name, float32 array)] in order. Header padded with spaces to 8 bytes."""
    header, blobs, off = {}, [], 0
    for name, a in tensors:
        b = _to_bytes(a, dtype)
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)
