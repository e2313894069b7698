#!/usr/bin/python3
"""Draws gradsync timelines (Options::tuning.timeline / GRADSYNC_TIMELINE) as a per-rank Gantt chart.

    /usr/bin/python3 examples/timeline_gantt.py TRACE [TRACE ...] -o timeline.png [--last-steps K]
    /usr/bin/python3 examples/timeline_gantt.py TRACE --merge merged.json   # one file for Perfetto

TRACE is a rank's file (trace.rank0.json) or the path given to GRADSYNC_TIMELINE (trace.json): then
every trace.rank<r>.json beside it is read. Needs only the standard library and matplotlib (Debian's
python3-matplotlib; run it with /usr/bin/python3 if another python3 lacks it). See docs/TIMELINE.md.
"""
import argparse
import glob
import json
import os
import re
import sys


def trace_files(paths):
    files = []
    for p in paths:
        if os.path.exists(p):
            files.append(p)
            continue
        root, ext = os.path.splitext(p)
        found = glob.glob(glob.escape(root) + ".rank*" + glob.escape(ext))
        if not found:
            sys.exit(f"timeline_gantt: neither {p} nor {root}.rank<r>{ext} exists")
        rank = lambda f: int(re.search(r"\.rank(\d+)", f).group(1))
        files.extend(sorted(found, key=rank))
    return files


def load(files):
    events = []
    for f in files:
        with open(f) as fh:
            events.extend(json.load(fh)["traceEvents"])
    return events


# Colours by event name; spans not listed are grey.
COLOURS = {
    "synchronize": "#d9d9d9",
    "arrival check": "#fdae6b",
    "consistency check": "#e6550d",
    "plan build": "#9e9ac8",
    "wait": "#fb6a4a",
    "local scaling": "#a1d99b",
    "pack": "#6baed6",
    "unpack": "#74c476",
    "allreduce": "#3182bd",
}
LANE_NAMES = {0: "host", 1: "pack", 2: "unpack"}


def window(events, last_steps):
    """[t0, t1] in us: everything, or the last K steps (from the end of the synchronize() before)."""
    ts = [e["ts"] for e in events if e["ph"] in "Xi"]
    ends = [e["ts"] + e.get("dur", 0) for e in events if e["ph"] in "Xi"]
    t0, t1 = min(ts), max(ends)
    if last_steps:
        by_rank = {}
        for e in events:
            if e["ph"] == "X" and e["name"] == "synchronize":
                by_rank.setdefault(e["pid"], []).append(e["ts"] + e["dur"])
        starts = []
        for r, stops in by_rank.items():
            stops.sort()
            if len(stops) <= last_steps:
                return t0, t1
            # From the rank's first event after its previous step (the program's own work in
            # between is not in the trace).
            prev = stops[-last_steps - 1]
            starts.append(min(e["ts"] for e in events if e["pid"] == r and e["ph"] in "Xi" and e["ts"] >= prev))
        if starts:
            t0 = min(starts)
    return t0, t1


def draw(events, out, last_steps, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    t0, t1 = window(events, last_steps)
    scale = 1e-3  # us -> ms
    ranks = sorted({e["pid"] for e in events})
    lanes = {r: sorted({e["tid"] for e in events if e["pid"] == r and e["ph"] in "Xi"}) for r in ranks}
    # Rows: host, pack, unpack, then every reduction lane of the rank as a thin stripe of one
    # double-height row (the chunks in flight at once).
    rows, ticks, labels, y = {}, [], [], 0
    thin = {}
    for r in ranks:
        reduce_lanes = [t for t in lanes[r] if t >= 10]
        for tid in [t for t in lanes[r] if t < 10]:
            rows[(r, tid)] = y
            ticks.append(y)
            labels.append(f"rank {r} {LANE_NAMES.get(tid, str(tid))}")
            y += 1
        if reduce_lanes:
            k = len(reduce_lanes)
            for i, tid in enumerate(reduce_lanes):
                rows[(r, tid)] = y - 0.4 + (i + 0.5) * 2.0 / k
                thin[(r, tid)] = 1.8 / k
            ticks.append(y + 0.6)
            labels.append(f"rank {r} reductions ({k} lanes)")
            y += 2.2
        y += 0.5  # a gap between ranks
    fig, ax = plt.subplots(figsize=(13, 0.42 * y + 2.2))
    spans = [e for e in events if e["ph"] == "X" and e["ts"] + e["dur"] >= t0 and e["ts"] <= t1]
    # Nesting depth within a lane: inner spans are drawn thinner on top of their parents.
    spans.sort(key=lambda e: (e["pid"], e["tid"], e["ts"], -e["dur"]))
    stack, last_lane = [], None
    for e in spans:
        lane = (e["pid"], e["tid"])
        if lane != last_lane:
            stack, last_lane = [], lane
        while stack and stack[-1] <= e["ts"]:
            stack.pop()
        depth = len(stack)
        stack.append(e["ts"] + e["dur"])
        h = thin.get(lane, 0.8) * (0.75 ** depth)
        ax.broken_barh([((e["ts"] - t0) * scale, max(e["dur"] * scale, 1e-4))], (rows[lane] - h / 2, h),
                       facecolors=COLOURS.get(e["name"], "#bdbdbd"), edgecolor="black", linewidth=0.2,
                       zorder=2 + depth)
    for e in events:
        if e["ph"] != "i" or not (t0 <= e["ts"] <= t1):
            continue
        x, yy = (e["ts"] - t0) * scale, rows[(e["pid"], e["tid"])]
        if e["name"] == "mark_ready":
            ax.plot([x, x], [yy - 0.45, yy + 0.45], color="black", linewidth=0.5, zorder=10)
        elif e["name"] == "stall warning" or e["name"].endswith("Error"):
            miss = e["args"].get("missing_ranks", "")
            ax.plot(x, yy, marker="v" if e["name"] == "stall warning" else "X", color="red", markersize=9, zorder=11)
            ax.annotate(f"{e['name']}" + (f"\nmissing {miss}" if miss else ""), (x, yy), xytext=(4, 6),
                        textcoords="offset points", color="red", fontsize=7, zorder=12)
    ax.set_yticks(ticks)
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.06 * (t1 - t0) * scale)  # room for the labels of events at the end
    ax.set_xlabel("ms")
    ax.grid(axis="x", linewidth=0.3)
    legend = [Patch(facecolor=c, edgecolor="black", linewidth=0.3, label=n) for n, c in COLOURS.items()]
    legend.append(plt.Line2D([], [], color="black", linewidth=0.8, label="mark_ready"))
    legend.append(plt.Line2D([], [], color="red", marker="v", linestyle="", label="stall warning / error"))
    ax.legend(handles=legend, fontsize=7, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.7 / (0.42 * y + 2.2)))
    if title:
        ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"timeline_gantt: wrote {out} ({len(spans)} spans, {len(ranks)} ranks, {(t1 - t0) * scale:.2f} ms)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", help="trace files, or the GRADSYNC_TIMELINE path of a multi-rank run")
    ap.add_argument("-o", "--output", help="PNG to draw")
    ap.add_argument("--merge", help="write all ranks' events into one Chrome trace JSON")
    ap.add_argument("--last-steps", type=int, default=0, help="draw only the last K steps (0: everything)")
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    if not a.output and not a.merge:
        ap.error("give -o PNG and/or --merge JSON")
    events = load(trace_files(a.traces))
    if a.merge:
        with open(a.merge, "w") as fh:
            json.dump({"displayTimeUnit": "ms", "traceEvents": events}, fh)
        print(f"timeline_gantt: wrote {a.merge} ({len(events)} events)")
    if a.output:
        draw(events, a.output, a.last_steps, a.title)


if __name__ == "__main__":
    main()
