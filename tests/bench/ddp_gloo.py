#!/usr/bin/python3
"""PyTorch DDP over gloo on the benchmark models' parameter shapes: the peer gradsync is compared to.

A dummy module holds float parameters of each model's shapes; its forward touches every parameter
once (loss = sum of the parameters' sums), so backward produces a gradient for every parameter and
DDP's bucketed reducer (25 MiB buckets, reverse order, rebuilt after the first step) allreduces
them over gloo exactly as in training. The sync time is the median of (DDP backward) minus the
median of (the same backward under no_sync()), interleaved repetitions, slowest rank.

usage: ddp_gloo.py <models_dir> <out.csv> <ranks> [budget_s] [section] [model name filter] [--hook=bf16|fp16]
       mpirun ... ddp_gloo.py <models_dir> <out.csv> mpi [budget_s] [section] [model name filter] [--hook=...]
The first spawns <ranks> local processes; the second takes rank and size from Open MPI's launcher
(OMPI_COMM_WORLD_*) and the rendezvous from MASTER_ADDR / MASTER_PORT (across hosts: host 0's
address; GLOO_SOCKET_IFNAME names the interface gloo uses).
Appends rows  <section, default models>,<model>,DDP gloo,<bytes>,<tensors>,<ranks>,<median_s>,<reps>  (rank 0).
--hook=bf16 / --hook=fp16 registers PyTorch's bf16_compress_hook / fp16_compress_hook (each bucket cast
to the 16-bit type and divided by the world size, allreduced, cast back): the method is then
"DDP gloo bf16 hook" / "DDP gloo fp16 hook". A hook that gloo cannot run is reported as a row-less
message with the error.
"""
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def csv_shapes(path):
    shapes = []
    with open(path) as f:
        next(f)
        for line in f:
            line = line.strip()
            if line:
                shapes.append([int(x) for x in line.split(",")[1].split("x")])
    return shapes


def dlrm_mlp_shapes(path):
    cfg = json.load(open(path))
    shapes = []
    for key in ("bottom_mlp", "top_mlp"):
        layers = cfg[key]
        for a, b in zip(layers[:-1], layers[1:]):
            shapes += [[b, a], [b]]
    return shapes


def models(d):
    return [
        ("ResNet-50", csv_shapes(os.path.join(d, "resnet50.csv"))),
        ("ViT-B/16", csv_shapes(os.path.join(d, "vit_b_16.csv"))),
        ("MobileNetV2", csv_shapes(os.path.join(d, "mobilenet_v2.csv"))),
        ("DLRM (MLP)", dlrm_mlp_shapes(os.path.join(d, "dlrm_criteo_kaggle.json"))),
    ]


class Dummy(torch.nn.Module):
    def __init__(self, shapes):
        super().__init__()
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.full(s, 1e-3)) for s in shapes])

    def forward(self):
        return torch.stack([p.sum() for p in self.ps]).sum()


def step(model):
    model().backward()


def timed(fn):
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(dt, op=dist.ReduceOp.MAX)
    return dt.item()


def register_hook(ddp, hook):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    ddp.register_comm_hook(None, {"bf16": default_hooks.bf16_compress_hook,
                                  "fp16": default_hooks.fp16_compress_hook}[hook])


def worker(rank, world, port, models_dir, out, budget, section="models", only="", hook=""):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    for name, shapes in models(models_dir):
        if only not in name:
            continue
        torch.manual_seed(0)
        ddp = torch.nn.parallel.DistributedDataParallel(Dummy(shapes))
        label = "DDP gloo" + (f" {hook} hook" if hook else "")
        if hook:
            register_hook(ddp, hook)
        try:
            for _ in range(3):  # the first step rebuilds the buckets in ready order
                step(ddp)
        except Exception as e:  # e.g. a dtype gloo's allreduce does not take
            if rank == 0:
                print(f"  {section:<10} {name:<22} {label}: refused: {str(e).splitlines()[0]}", flush=True)
            del ddp
            continue

        def local():
            with ddp.no_sync():
                step(ddp)

        probe = timed(lambda: step(ddp)) + timed(local)
        reps = max(7, min(101, int(budget / max(probe, 1e-6))))
        t_ddp, t_local = [], []
        for _ in range(reps):
            t_ddp.append(timed(lambda: step(ddp)))
            t_local.append(timed(local))
        sync = statistics.median(t_ddp) - statistics.median(t_local)
        numel = sum(p.numel() for p in ddp.parameters())
        if rank == 0:
            row = f"{section},{name},{label},{4 * numel},{len(shapes)},{world},{sync:.9g},{reps}\n"
            with open(out, "a") as f:
                f.write(row)
            print(f"  {section:<10} {name:<22} {label} (backward {statistics.median(t_ddp) * 1e3:.3f} ms, "
                  f"no_sync {statistics.median(t_local) * 1e3:.3f} ms)  sync {sync * 1e3:10.3f} ms", flush=True)
        del ddp
    dist.destroy_process_group()


def main():
    hook = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--hook=")), "")
    argv = [a for a in sys.argv if not a.startswith("--hook=")]
    if hook not in ("", "bf16", "fp16"):
        sys.exit(f"ddp_gloo.py: --hook={hook}: use bf16 or fp16")
    models_dir, out = argv[1], argv[2]
    budget = float(argv[4]) if len(argv) > 4 else 8.0
    section = argv[5] if len(argv) > 5 else "models"
    only = argv[6] if len(argv) > 6 else ""
    if argv[3] == "mpi":
        worker(int(os.environ["OMPI_COMM_WORLD_RANK"]), int(os.environ["OMPI_COMM_WORLD_SIZE"]),
               int(os.environ.get("MASTER_PORT", "29500")), models_dir, out, budget, section, only, hook)
        return
    world = int(argv[3])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(world, port, models_dir, out, budget, section, only, hook), nprocs=world, join=True)


if __name__ == "__main__":
    main()
