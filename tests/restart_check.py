#!/usr/bin/env python3
"""Checkpoint and restart of an example, against the same run uninterrupted (issue 33).

Usage: restart_check.py --launch 'mpiexec|-n' --flags 'A|B' --ranks N --restart M1,M2,.. --steps S
                        --dir D -- PROGRAM [ARGS...]

Runs PROGRAM ARGS --digest on N ranks for 2S steps (the reference), then S steps ending in
--save D/restart.h5, then from --load D/restart.h5 S more steps on each rank count M. The program
prints 'parameters digest: X' (X with 17 significant digits). At M == N the digest must equal the
reference exactly; at another rank count within 1e-10 relative (the sums run in another order).
"""
import argparse
import os
import re
import subprocess
import sys


def run(launch, flags, ranks, argv):
    cmd = launch + [str(ranks)] + flags + argv
    env = dict(os.environ, GSYNC_TEST_RANKS=str(ranks))
    print("$", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(p.stdout, end="", flush=True)
    if p.returncode != 0:
        sys.exit("restart check FAILED: exit status %d" % p.returncode)
    m = re.search(r"parameters digest: (\S+)", p.stdout)
    if not m:
        sys.exit("restart check FAILED: no 'parameters digest:' line")
    return m.group(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launch", required=True)
    ap.add_argument("--flags", default="")
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--restart", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("program", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    launch = [x for x in a.launch.split("|") if x]
    flags = [x for x in a.flags.split("|") if x]
    prog = [x for x in a.program if x != "--"]
    os.makedirs(a.dir, exist_ok=True)
    ck = os.path.join(a.dir, "restart.h5")
    for stale in (ck, ck + ".partial"):
        if os.path.exists(stale):
            os.remove(stale)
    steps = str(a.steps)
    reference = run(launch, flags, a.ranks, prog + ["--digest", "--steps", str(2 * a.steps)])
    run(launch, flags, a.ranks, prog + ["--digest", "--steps", steps, "--save", ck])
    failed = []
    for m in [int(x) for x in a.restart.split(",")]:
        got = run(launch, flags, m, prog + ["--digest", "--steps", steps, "--load", ck])
        rel = abs(float(got) - float(reference)) / abs(float(reference))
        exact = m == a.ranks
        ok = got == reference if exact else rel <= 1e-10
        print("restart on %d ranks: digest %s, uninterrupted on %d: %s (relative difference %.1e, %s)"
              % (m, got, a.ranks, reference, rel, "must be equal" if exact else "tolerance 1e-10"))
        if not ok:
            failed.append(m)
    if failed:
        sys.exit("restart check FAILED at %s ranks" % failed)
    print("restart check PASSED")


if __name__ == "__main__":
    main()
