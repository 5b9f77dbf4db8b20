"""Reads a sharded moetrain checkpoint as doc/checkpoints.md describes it, with the
safetensors package as the oracle for the shard files: every shard opens, every slice
of index.json is the tensor its key names in its file (dtype, shape, byte range), its
CRC-32 per block is zlib's, and the slices of each tensor cover it exactly once.

usage: ckpt_format.py ITER_DIR [ITER_DIR_2]
With a second directory (the same state, saved in another layout), the whole tensors
of both must be equal bit for bit."""
import json
import os
import sys
import zlib

import numpy as np
from safetensors import safe_open


def read(d):
    index = json.load(open(os.path.join(d, "index.json")))
    assert index["format"] == "moetrain.sharded" and index["version"] == 1, index["format"]
    block = index["block_bytes"]
    tensors = {t["name"]: np.zeros(t["shape"], np.float32) for t in index["tensors"]}
    seen = {n: np.zeros(a.shape, np.int32) for n, a in tensors.items()}
    files = {}
    for s in index["slices"]:
        f = s["file"]
        if f not in files:
            files[f] = safe_open(os.path.join(d, f), framework="numpy")
        data = files[f].get_tensor(s["key"])
        lo, hi = s["range"]
        assert data.dtype == np.float32 and data.size == hi - lo == s["bytes"] // 4, s["key"]
        raw = open(os.path.join(d, f), "rb").read()[s["offset"]:s["offset"] + s["bytes"]]
        assert raw == data.tobytes(), "%s: bytes %d.. are not the key's data" % (s["key"], s["offset"])
        crcs = [zlib.crc32(raw[i:i + block]) for i in range(0, len(raw), block)]
        assert crcs == s["crc32"], "%s: checksums" % s["key"]
        box = tuple(slice(a, a + n) for a, n in zip(s["start"], s["shape"]))
        for arr, value in ((tensors[s["tensor"]], data.reshape(-1)), (seen[s["tensor"]], 1)):
            flat = arr[box].reshape(-1).copy()   # the box, row-major
            if arr.dtype == np.int32:
                flat[lo:hi] += 1
            else:
                flat[lo:hi] = value
            arr[box] = flat.reshape(arr[box].shape)
    for n, c in seen.items():
        assert (c == 1).all(), "%s: %d elements stored %s times" % (n, (c != 1).sum(), sorted(set(c.reshape(-1).tolist())))
    return index, tensors


index, a = read(sys.argv[1])
print("%s: %d tensors, %d slices in %d files, layout %s: every element stored once, checksums match"
      % (sys.argv[1], len(a), len(index["slices"]), len({s["file"] for s in index["slices"]}),
         index["layout"]))
if len(sys.argv) > 2:
    _, b = read(sys.argv[2])
    assert a.keys() == b.keys()
    for n in a:
        assert a[n].tobytes() == b[n].tobytes(), "%s differs" % n
    print("%s: the same tensors, bit for bit" % sys.argv[2])
