#!/usr/bin/env python3
"""SimGrid platforms for tests/bench/sim (docs/SCALING.md): two-level non-blocking fat-trees.

    platforms.py OUTDIR HOSTS [--gbps 100] [--ranks-per-host 1]

writes OUTDIR/fattree_<HOSTS>_<gbps>g.xml (HOSTS a square: k hosts per leaf switch, k leaves, k
spines; every link <gbps> Gb/s and 0.25 us, so 1 us host to host through a spine; ranks on one host
talk through its loopback at 4x the link and 0.1 us, the shared-memory level) and
OUTDIR/hosts_<HOSTS>x<ranks-per-host>.txt (the hostfile: each host listed once per rank on it).
Prints the two paths.
"""
import argparse
import math
import os

ap = argparse.ArgumentParser()
ap.add_argument("outdir")
ap.add_argument("hosts", type=int)
ap.add_argument("--gbps", type=int, default=100)
ap.add_argument("--ranks-per-host", type=int, default=1)
a = ap.parse_args()
k = math.isqrt(a.hosts)
if k * k != a.hosts:
    raise SystemExit(f"platforms.py: {a.hosts} hosts is not a square (k hosts per leaf, k leaves)")
os.makedirs(a.outdir, exist_ok=True)
xml = os.path.join(a.outdir, f"fattree_{a.hosts}_{a.gbps}g.xml")
with open(xml, "w") as f:
    f.write(f"""<?xml version='1.0'?>
<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">
<!-- {a.hosts} hosts: 2-level non-blocking fat-tree, {k} hosts per leaf switch, {k} leaves, {k} spines;
     every link {a.gbps} Gb/s and 0.25 us (1 us host to host through a spine); loopback (ranks of
     one host) {4 * a.gbps} Gb/s and 0.1 us. -->
<platform version="4.1">
  <cluster id="ft{a.hosts}" prefix="node-" radical="0-{a.hosts - 1}" suffix="" speed="100Gf"
           bw="{a.gbps}Gbps" lat="0.25us" loopback_bw="{4 * a.gbps}Gbps" loopback_lat="0.1us"
           topology="FAT_TREE" topo_parameters="2;{k},{k};1,{k};1,1"/>
</platform>
""")
hosts = os.path.join(a.outdir, f"hosts_{a.hosts}x{a.ranks_per_host}.txt")
with open(hosts, "w") as f:
    f.write("".join(f"node-{i}\n" * a.ranks_per_host for i in range(a.hosts)))
print(xml)
print(hosts)
