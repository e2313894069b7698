#!/usr/bin/env python3
"""Reads a gradsync checkpoint with h5py, outside gradsync (issue 33).

Usage: checkpoint_h5py.py BASE NP. test_checkpoint left BASE.h5 and BASE.<rank>.txt, one line per
parameter: "data_parallel NAME v0 v1 ..." (rank 0) or "local NAME v0 ..." (its rank), values with
17 significant digits, so that they parse back to the exact doubles. Every value must be equal in
the file, and each parameter's checksum attribute must be format 2's (FNV-1a 64 over its 64-bit words in
4 lanes, include/gradsync/impl/checkpoint_catalog.hpp). The row-sharded
table of the restart test (BASE's directory: checkpoint_reshard_npNP.h5, its values in
checkpoint_reshard_npNP.emb.txt) must hold the whole table, its checksum the sum over rows of each
row's checksum seeded with the row number's FNV-1a 64.
"""
import os
import sys

import h5py
import numpy as np


def fnv1a64(data: bytes, h: int = 1469598103934665603) -> int:
    """FNV-1a 64 of the bytes (format 1's checksum; here the seed of a row's)."""
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def words64(data: bytes, seed: int = 1469598103934665603) -> int:
    """Format 2's checksum: FNV-1a over little-endian 64-bit words in 4 interleaved lanes."""
    prime, mask = 1099511628211, 0xFFFFFFFFFFFFFFFF
    lane = [seed, seed ^ 1, seed ^ 2, seed ^ 3]
    blocks = len(data) // 32
    for b in range(blocks):
        for k in range(4):
            w = int.from_bytes(data[b * 32 + k * 8:b * 32 + k * 8 + 8], "little")
            lane[k] = ((lane[k] ^ w) * prime) & mask
    for byte in data[blocks * 32:]:
        lane[0] = ((lane[0] ^ byte) * prime) & mask
    h = lane[0]
    for k in range(1, 4):
        h = ((h ^ lane[k]) * prime) & mask
    return h


def text(attr) -> str:
    return attr.decode() if isinstance(attr, bytes) else str(attr)


def main() -> int:
    base, nranks = sys.argv[1], int(sys.argv[2])
    failures = []
    with h5py.File(base + ".h5", "r") as f:
        root = f.attrs
        if text(root["format"]) != "gradsync-checkpoint" or int(root["format_version"]) != 2:
            failures.append("root attributes: format %r version %r" % (root.get("format"), root.get("format_version")))
        if int(root["ranks"]) != nranks or int(root["complete"]) != 1:
            failures.append("root attributes: ranks %r complete %r" % (root.get("ranks"), root.get("complete")))
        checked = {"data_parallel": 0, "local": 0}
        for rank in range(nranks):
            with open("%s.%d.txt" % (base, rank)) as dump:
                for line in dump:
                    kind, name, *values = line.split()
                    expected = np.array([float(v) for v in values], dtype=np.float64)
                    entry = f[kind][name.replace("%", "%25").replace("/", "%2F")]
                    param = entry["param"]
                    got = param[()]
                    if param.dtype != np.float64 or not np.array_equal(got, expected):
                        failures.append("%s/%s: %s in the file, %s in the dump" % (kind, name, got, expected))
                    if text(entry.attrs["name"]) != name:
                        failures.append("%s/%s: name attribute %r" % (kind, name, entry.attrs["name"]))
                    if kind == "local" and int(entry.attrs["rank"]) != rank:
                        failures.append("%s/%s: written by rank %r, dumped by %d" % (kind, name, entry.attrs["rank"], rank))
                    if int(param.attrs["checksum"]) != words64(got.astype("<f8").tobytes()):
                        failures.append("%s/%s: checksum %r is not the 4-lane FNV-1a of its words" % (kind, name, param.attrs["checksum"]))
                    checked[kind] += 1
        # The data-parallel parameters are in the file once, the towers once per rank.
        if checked["data_parallel"] != 2 or len(f["data_parallel"]) != 2:
            failures.append("data-parallel parameters: %d dumped, %d in the file" % (checked["data_parallel"], len(f["data_parallel"])))
        if checked["local"] != 2 * nranks or len(f["local"]) != 2 * nranks:
            failures.append("local parameters: %d dumped, %d in the file" % (checked["local"], len(f["local"])))
    # The restart test's table, saved as NP row shards: one dataset of the whole table.
    reshard = os.path.join(os.path.dirname(base) or ".", "checkpoint_reshard_np%d" % nranks)
    with h5py.File(reshard + ".h5", "r") as f, open(reshard + ".emb.txt") as dump:
        expected = np.array([float(v) for v in dump.read().split()], dtype=np.float64)
        table = f["sharded"]["emb"]
        rows, length = int(table.attrs["global_rows"]), int(table.attrs["row_length"])
        got = table["param"][()]
        if got.shape != (rows * length,) or not np.array_equal(got, expected):
            failures.append("sharded/emb: %s in the file, %s in the dump" % (got, expected))
        raw = got.astype("<f8").tobytes()
        width = 8 * length
        want = sum(words64(raw[r * width:(r + 1) * width], fnv1a64(r.to_bytes(8, "little"))) for r in range(rows))
        if int(table["param"].attrs["checksum"]) != want & 0xFFFFFFFFFFFFFFFF:
            failures.append("sharded/emb: checksum %r is not the sum of its rows' FNV-1a" % table["param"].attrs["checksum"])
        if int(table.attrs["shards"]) != nranks:
            failures.append("sharded/emb: %r shards, %d ranks wrote it" % (table.attrs["shards"], nranks))
    for msg in failures:
        print("h5py: FAILED:", msg)
    if failures:
        return 1
    print("h5py: %d data-parallel and %d local parameters and a table of %d shards equal to the C++ side's"
          % (checked["data_parallel"], checked["local"], nranks))
    print("h5py: every check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
