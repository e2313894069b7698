#!/usr/bin/env python3
"""Predicted sync time against simulated ranks (docs/SCALING.md), as a self-contained SVG.

    plot.py scaling.csv scaling.svg

scaling.csv has a header and the columns model,gbps,ranks,ranks_per_host,sim_ms,bound_ms[,note]:
one simulated sync (sim.sh run) and the ring's alpha-beta bound for the same bytes (empty: drawn
with another series of the same bytes). Each model and
link speed is one colour: the simulation a solid line with dots, the ring's bound a dashed line.
Rows with ranks_per_host other than 1 are drawn as open diamonds without a line. Log-log axes.
Only Python's standard library.
"""
import csv
import math
import sys
from collections import defaultdict
from xml.sax.saxutils import escape

W, H = 820, 520
L, R, T, B = 70, 270, 40, 60  # margins: the legend sits in the right one
COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]


def main(src, dst):
    rows = list(csv.DictReader(open(src)))
    series = defaultdict(list)  # (model, gbps) -> rows
    for r in rows:
        series[(r["model"], int(r["gbps"]))].append(r)
    ranks = [int(r["ranks"]) for r in rows]
    ys = [float(r[k]) for r in rows for k in ("sim_ms", "bound_ms") if r.get(k)]
    x0, x1 = math.log2(min(ranks)) - 0.3, math.log2(max(max(ranks), 4096)) + 0.3
    y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
    px = lambda n: L + (math.log2(n) - x0) / (x1 - x0) * (W - L - R)
    py = lambda v: H - B - (math.log10(v) - y0) / (y1 - y0) * (H - T - B)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{(L + W - R) / 2}" y="22" text-anchor="middle" font-size="14">'
           'gradsync sync time under SimGrid SMPI (fat-tree; blocking, old rule, unless named)</text>']
    # grid and ticks
    for e in range(int(math.ceil(x0)), int(math.floor(x1)) + 1):
        x = px(2**e)
        out.append(f'<line x1="{x:.1f}" y1="{T}" x2="{x:.1f}" y2="{H - B}" stroke="#ddd"/>')
        out.append(f'<text x="{x:.1f}" y="{H - B + 16}" text-anchor="middle">{2**e}</text>')
    for e in range(y0, y1 + 1):
        for m in (1, 2, 5):
            v = m * 10.0**e
            if not (10.0**y0 <= v <= 10.0**y1):
                continue
            y = py(v)
            out.append(f'<line x1="{L}" y1="{y:.1f}" x2="{W - R}" y2="{y:.1f}" stroke="{"#ccc" if m == 1 else "#eee"}"/>')
            out.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{v:g}</text>')
    out.append(f'<rect x="{L}" y="{T}" width="{W - L - R}" height="{H - T - B}" fill="none" stroke="black"/>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 18}" text-anchor="middle">simulated ranks</text>')
    out.append(f'<text transform="translate(18,{(T + H - B) / 2}) rotate(-90)" text-anchor="middle">'
               'one synchronize() (ms, simulated)</text>')
    # series
    ly = T + 10
    for i, ((model, gbps), rs) in enumerate(sorted(series.items())):
        c = COLOURS[i % len(COLOURS)]
        flat = sorted((r for r in rs if r["ranks_per_host"] in ("", "1")), key=lambda r: int(r["ranks"]))
        other = [r for r in rs if r["ranks_per_host"] not in ("", "1")]
        for key, dash in (("sim_ms", ""), ("bound_ms", ' stroke-dasharray="5,4"')):
            pts = [(px(int(r["ranks"])), py(float(r[key]))) for r in flat if r.get(key)]
            if len(pts) > 1:
                out.append(f'<polyline fill="none" stroke="{c}" stroke-width="{2 if not dash else 1.3}"{dash} '
                           f'points="{" ".join(f"{x:.1f},{y:.1f}" for x, y in pts)}"/>')
            if key == "sim_ms":
                out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{c}"/>' for x, y in pts]
        for r in other:
            x, y = px(int(r["ranks"])), py(float(r["sim_ms"]))
            out.append(f'<path d="M{x:.1f},{y - 5:.1f} L{x + 5:.1f},{y:.1f} L{x:.1f},{y + 5:.1f} L{x - 5:.1f},{y:.1f} Z" '
                       f'fill="white" stroke="{c}" stroke-width="1.5"/>')
        out.append(f'<line x1="{W - R + 12}" y1="{ly}" x2="{W - R + 36}" y2="{ly}" stroke="{c}" stroke-width="2"/>')
        out.append(f'<circle cx="{W - R + 24}" cy="{ly}" r="3.5" fill="{c}"/>')
        out.append(f'<text x="{W - R + 42}" y="{ly + 4}">{escape(model)}, {gbps} Gb/s</text>')
        if any(r.get("bound_ms") for r in rs):  # a series may leave its bound to another's line
            out.append(f'<line x1="{W - R + 12}" y1="{ly + 16}" x2="{W - R + 36}" y2="{ly + 16}" stroke="{c}" '
                       'stroke-width="1.3" stroke-dasharray="5,4"/>')
            out.append(f'<text x="{W - R + 42}" y="{ly + 20}" fill="#555">ring bound</text>')
            ly += 40
        else:
            ly += 22
    if any(r["ranks_per_host"] not in ("", "1") for r in rows):
        out.append(f'<path d="M{W - R + 24},{ly - 5} L{W - R + 29},{ly} L{W - R + 24},{ly + 5} L{W - R + 19},{ly} Z" '
                   'fill="white" stroke="black" stroke-width="1.5"/>')
        out.append(f'<text x="{W - R + 42}" y="{ly + 4}">4 ranks per host</text>')
    out.append("</svg>")
    open(dst, "w").write("\n".join(out) + "\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
