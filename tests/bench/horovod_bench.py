#!/usr/bin/python3
"""Horovod 0.28.1 (PyTorch, MPI controller) on the benchmark models' gradient shapes: a peer of gradsync.

Launched by mpirun like any MPI program. Per model, one step is what hvd.DistributedOptimizer does
after backward: one hvd.allreduce_async_ per gradient (op Average, in reverse registration order as
backward produces them), then synchronize() on every handle. Horovod's background thread fuses the
tensors that are ready into buffers of HOROVOD_FUSION_THRESHOLD bytes (set by the caller: the
benchmark runs 4 MiB and Horovod's default 64 MiB and keeps each one's rows). With --fp16, each
gradient is compressed as hvd.Compression.fp16 does (a cast to float16 before, back after).
Time: median over repetitions of the slowest rank's step (a barrier before each).

usage: mpirun ... horovod_bench.py <models_dir> <out.csv> <section> [budget_s] [--fp16] [--only=NAME]
(--only: the models whose name contains NAME, e.g. --only=ResNet)
Appends rows  <section>,<model>,Horovod <fusion>[ fp16],<bytes>,<tensors>,<ranks>,<median_s>,<reps>  (rank 0).
"""
import os
import statistics
import sys
import time

import torch
import horovod.torch as hvd

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ddp_gloo import models  # noqa: E402  (the same shapes DDP is measured on)


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    fp16 = "--fp16" in sys.argv
    only = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--only=")), "")
    models_dir, out, section = args[0], args[1], args[2]
    budget = float(args[3]) if len(args) > 3 else 6.0
    hvd.init()
    torch.set_num_threads(1)
    fusion = int(os.environ.get("HOROVOD_FUSION_THRESHOLD", 64 << 20))
    label = f"Horovod {fusion >> 20}MiB fusion" + (" fp16" if fp16 else "")
    for name, shapes in models(models_dir):
        if only not in name:
            continue
        grads = [torch.full(s, 1e-3) for s in shapes]
        order = list(reversed(range(len(grads))))

        def step():
            if fp16:
                wire = [grads[i].half() for i in order]
                handles = [hvd.allreduce_async_(w, op=hvd.Average, name=f"g{i}") for w, i in zip(wire, order)]
                for h, w, i in zip(handles, wire, order):
                    hvd.synchronize(h)
                    grads[i].copy_(w)
            else:
                handles = [hvd.allreduce_async_(grads[i], op=hvd.Average, name=f"g{i}") for i in order]
                for h in handles:
                    hvd.synchronize(h)

        def timed():
            hvd.allreduce(torch.zeros(1), name="barrier", op=hvd.Sum)
            t0 = time.perf_counter()
            step()
            dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
            return hvd.allreduce(dt, name="t", op=hvd.Max).item()

        for _ in range(3):
            timed()
        probe = timed()
        reps = max(7, min(101, int(budget / max(probe, 1e-6))))
        t = [timed() for _ in range(reps)]
        numel = sum(g.numel() for g in grads)
        if hvd.rank() == 0:
            with open(out, "a") as f:
                f.write(f"{section},{name},{label},{4 * numel},{len(shapes)},{hvd.size()},{statistics.median(t):.9g},{reps}\n")
            print(f"  {section:<10} {name:<22} {label:<26} {statistics.median(t) * 1e3:10.3f} ms", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    main()
