#!/usr/bin/env python3
"""Plots what `online_closure --plot FILE.png` wrote: the field and the error curves.

    python3 plot_closure.py BASE FILE.png ROLLOUT DT

BASE_field.csv     x, reference (the fine solution restricted), plain, corrected: the end of the last
                   free-running window after training
BASE_fine.csv      x, u: the fine solution itself at that time
BASE_history.csv   step, time, corrected, plain: the one-step RMS error of every training step
BASE_rollouts.csv  end_step, corrected, plain, reference, after_training: the free-running windows

Needs matplotlib (Debian: apt-get install python3-matplotlib).
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {k: [float(r[k]) for r in rows] for k in (rows[0].keys() if rows else [])}


def smooth(v, k):
    """Mean over windows of k values (k >= 1), one point per window."""
    return [sum(v[i:i + k]) / len(v[i:i + k]) for i in range(0, len(v), k)]


def main():
    base, out, rollout, dt = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    field, fine = read(base + "_field.csv"), read(base + "_fine.csv")
    hist, wins = read(base + "_history.csv"), read(base + "_rollouts.csv")

    fig = plt.figure(figsize=(16, 5.2))
    grid = fig.add_gridspec(2, 3, height_ratios=[2.2, 1])
    ax1 = fig.add_subplot(grid[0, 0])
    ax1e = fig.add_subplot(grid[1, 0], sharex=ax1)
    ax2 = fig.add_subplot(grid[:, 1])
    ax3 = fig.add_subplot(grid[:, 2])

    ax1.plot(fine["x"], fine["u"], color="0.75", lw=2.5, label="fine solver (%d cells)" % len(fine["x"]))
    ax1.plot(field["x"], field["reference"], "k.", ms=3, label="fine, restricted to the coarse grid")
    ax1.plot(field["x"], field["plain"], color="tab:red", lw=1.2, label="coarse, plain")
    ax1.plot(field["x"], field["corrected"], color="tab:blue", lw=1.2, label="coarse + learned closure")
    ax1.set_ylabel("u")
    ax1.set_title("after %d free-running coarse steps (%.2f time units), closure frozen" % (rollout, rollout * dt),
                  fontsize=10)
    ax1.legend(fontsize=7, loc="best")
    ax1.tick_params(labelbottom=False)
    ref = field["reference"]
    ax1e.plot(field["x"], [a - r for a, r in zip(field["plain"], ref)], color="tab:red", lw=1)
    ax1e.plot(field["x"], [a - r for a, r in zip(field["corrected"], ref)], color="tab:blue", lw=1)
    ax1e.axhline(0, color="0.6", lw=0.5)
    ax1e.set_xlabel("x")
    ax1e.set_ylabel("u - fine")

    n = len(hist["step"])
    k = max(1, n // 60)
    steps = smooth(hist["step"], k)
    ax2.semilogy(steps, smooth(hist["plain"], k), color="tab:red", label="one step, plain coarse")
    ax2.semilogy(steps, smooth(hist["corrected"], k), color="tab:blue", label="one step, coarse + closure")
    train = [i for i, a in enumerate(wins.get("after_training", [])) if a == 0]
    if train:
        ax2.semilogy([wins["end_step"][i] for i in train], [wins["plain"][i] for i in train], "x", color="tab:red",
                     ms=4, label="after %d free steps, plain" % rollout)
        ax2.semilogy([wins["end_step"][i] for i in train], [wins["corrected"][i] for i in train], "o",
                     color="tab:blue", ms=3, mfc="none", label="after %d free steps, coarse + closure" % rollout)
    ax2.set_xlabel("solver step (one backward pass each)")
    ax2.set_ylabel("RMS error against the fine solution")
    ax2.set_title("errors during online training", fontsize=10)
    ax2.legend(fontsize=7, loc="best")

    # The ratio corrected / plain takes out the flow's own ups and downs: the closure's progress.
    ratio = [c / p if p > 0 else 1.0 for c, p in zip(hist["corrected"], hist["plain"])]
    m = 10
    ax3.semilogx(hist["step"][m - 1:], [sum(ratio[i - m + 1:i + 1]) / m for i in range(m - 1, n)], color="tab:blue",
                 label="one step (mean of %d steps)" % m)
    if train:
        ax3.semilogx([wins["end_step"][i] for i in train], [wins["corrected"][i] / wins["plain"][i] for i in train],
                     "o", color="tab:purple", ms=3, mfc="none", label="after %d free steps" % rollout)
    ax3.axhline(1, color="tab:red", lw=1, ls="--", label="plain coarse solver")
    ax3.set_xlabel("solver step")
    ax3.set_ylabel("error with closure / error without")
    ax3.set_title("the closure's error ratio falls as it trains", fontsize=10)
    ax3.set_ylim(0, 2)
    ax3.legend(fontsize=7, loc="upper right")

    fig.tight_layout()
    fig.savefig(out, dpi=80)
    print("plot: wrote", out)


if __name__ == "__main__":
    main()
