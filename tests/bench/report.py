#!/usr/bin/python3
"""Turns the rows of tests/bench/run.sh into the printed table, docs/BENCHMARKS.md and the plot.

usage: report.py <results.csv> <out_dir> <docs_dir> <machine.txt> <command>
"""
import collections
import csv
import os
import statistics
import subprocess
import sys

MODELS = ["ResNet-50", "ViT-B/16", "MobileNetV2", "DLRM (MLP)"]
TARGET_RAW = {"ResNet-50": 1.10, "ViT-B/16": 1.10, "MobileNetV2": 1.25}


def load(path):
    rows = []
    with open(path) as f:
        for r in csv.reader(f):
            if len(r) != 8:
                continue
            sec, case, method, nbytes, tensors, ranks, med, reps = r
            rows.append(dict(section=sec, case=case, method=method, bytes=int(nbytes), tensors=int(tensors),
                             ranks=int(ranks), t=float(med), reps=int(reps)))
    return merge_runs(rows)


def merge_runs(rows):
    """One row per measurement: run.sh repeats the models section (RUNS), and each run's median
    becomes one sample; the row keeps the median of the runs. A run's "raw best (chunk)" rows merge
    whatever chunk won, labelled with the chunk that won most often."""
    groups = collections.OrderedDict()
    for r in rows:
        m = r["method"]
        for best in ("raw best (", "raw+avg best (", "raw on huge pages ("):
            if m.startswith(best):
                m = best
        groups.setdefault((r["section"], r["case"], m, r["ranks"]), []).append(r)
    merged = []
    for (_, _, m, _), rs in groups.items():
        r = dict(rs[0])
        r["t"] = statistics.median(x["t"] for x in rs)
        r["reps"] = sum(x["reps"] for x in rs)
        r["runs"] = len(rs)
        if m.endswith("("):
            chunks = collections.Counter(x["method"][len(m):-1] for x in rs)
            r["method"] = m + chunks.most_common(1)[0][0] + ")"
        merged.append(r)
    return merged


def pick(rows, section, case, method=None, prefix=None, ranks=2):
    for r in rows:
        if r["section"] == section and r["case"] == case and r["ranks"] == ranks:
            if method is not None and r["method"] == method:
                return r
            if prefix is not None and r["method"].startswith(prefix):
                return r
    return None


def ms(x):
    return f"{x * 1e3:.2f}" if x is not None else "-"


def mib(b):
    return f"{b / 2**20:.1f}"


def hand_written(name):
    """A section of this page kept across its reruns: tests/bench/<name>, where it is edited (edits
    made to docs/BENCHMARKS.md itself are lost at the next run)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
    return [open(path).read().strip(), ""] if os.path.exists(path) else []


def main():
    results, out_dir, docs_dir, machine_file, command = sys.argv[1:6]
    rows = load(results)
    machine = open(machine_file).read().strip()
    md = []
    printed = []

    # ---- models, 2 ranks ----
    g0 = pick(rows, "models", "ResNet-50", "gradsync")
    runs = g0["runs"] if g0 else 1
    head = ("| model | MiB | tensors | gradsync ms | raw best ms (chunk) | raw+avg best ms (chunk) | "
            "per-tensor ms | DDP gloo ms | gradsync / raw | gradsync / raw+avg | gradsync op=sum ms | "
            "op=sum / raw | per-tensor / gradsync | DDP / gradsync | gradsync blocking ms | gradsync arena ms | "
            "arena / raw | raw on huge pages ms | arena / raw on huge pages | gradsync / raw on huge pages | "
            "gradsync on 4 KiB pages ms | 4 KiB pages / raw | per-tensor on huge pages ms |")
    md += [f"## Models, 2 ranks (median of {runs} runs)", "", head, "|" + " --- |" * 23]
    checks = []

    def ratio(a, b):
        return f"{a['t'] / b['t']:.2f}x" if a and b else "-"

    for m in MODELS:
        g = pick(rows, "models", m, "gradsync")
        if not g:
            continue
        raw = pick(rows, "models", m, prefix="raw best")
        ravg = pick(rows, "models", m, prefix="raw+avg best")
        pt = pick(rows, "models", m, "per-tensor")
        ddp = pick(rows, "models", m, "DDP gloo")
        nb = pick(rows, "models", m, "gradsync blocking")
        sm = pick(rows, "models", m, "gradsync op=sum")
        ar = pick(rows, "models", m, "gradsync arena")
        rh = pick(rows, "models", m, prefix="raw on huge pages")
        g4 = pick(rows, "models", m, "gradsync on 4 KiB pages")
        pth = pick(rows, "models", m, "per-tensor on huge pages")
        chunk = raw["method"][len("raw best ("):-1] if raw else "-"
        achunk = ravg["method"][len("raw+avg best ("):-1] if ravg else "-"
        r_raw = g["t"] / raw["t"] if raw else None
        r_pt = pt["t"] / g["t"] if pt else None
        r_ddp = ddp["t"] / g["t"] if ddp else None
        md.append(f"| {m} | {mib(g['bytes'])} | {g['tensors']} | {ms(g['t'])} | {ms(raw['t'] if raw else None)} ({chunk}) | "
                  f"{ms(ravg['t'] if ravg else None)} ({achunk}) | {ms(pt['t'] if pt else None)} | "
                  f"{ms(ddp['t'] if ddp else None)} | {ratio(g, raw)} | {ratio(g, ravg)} | "
                  f"{ms(sm['t'] if sm else None)} | {ratio(sm, raw)} | {ratio(pt, g)} | {ratio(ddp, g)} | "
                  f"{ms(nb['t'] if nb else None)} | {ms(ar['t'] if ar else None)} | {ratio(ar, raw)} | "
                  f"{ms(rh['t'] if rh else None)} | {ratio(ar, rh)} | {ratio(g, rh)} | "
                  f"{ms(g4['t'] if g4 else None)} | {ratio(g4, raw)} | {ms(pth['t'] if pth else None)} |")
        if m in TARGET_RAW and r_raw is not None:
            checks.append(f"{m}: gradsync / best raw = {r_raw:.2f}x (target <= {TARGET_RAW[m]:.2f}x): "
                          + ("met" if r_raw <= TARGET_RAW[m] else "NOT met")
                          + (f"; against raw on huge pages {g['t'] / rh['t']:.2f}x" if rh else "")
                          + (f"; on 4 KiB pages (huge_pages = false) {g4['t'] / raw['t']:.2f}x" if g4 else "")
                          + (f"; the same work as raw (op=sum) {sm['t'] / raw['t']:.2f}x" if sm else "")
                          + (f"; the default (average) against raw + average {g['t'] / ravg['t']:.2f}x" if ravg else "")
                          + (f"; gradients in one allocation (arena) {ar['t'] / raw['t']:.2f}x" if ar else "")
                          + (f", against raw on the same huge pages {ar['t'] / rh['t']:.2f}x" if ar and rh else ""))
        if m == "ResNet-50":
            if r_ddp:
                checks.append(f"ResNet-50: DDP gloo / gradsync = {r_ddp:.2f}x (target >= 4x): "
                              + ("met" if r_ddp >= 4 else "NOT met"))
            if r_pt:
                checks.append(f"ResNet-50: per-tensor MPI / gradsync = {r_pt:.2f}x (target >= 3x): "
                              + ("met" if r_pt >= 3 else "NOT met")
                              + (f"; per-tensor on the huge pages gradsync moved the gradients to "
                                 f"{pth['t'] / g['t']:.2f}x" if pth else ""))
    md += ["", "Targets, from this table:", ""] + [f"- {c}" for c in checks] + [""]
    dl = pick(rows, "models", "DLRM (MLP)", "gradsync")
    if dl:
        md += [f"DLRM: the tables stay local; gradsync allreduces {dl['bytes']:,} bytes per sync, exactly the MLP's "
               f"{dl['bytes'] // 4:,} float parameters (checked by the benchmark, which fails otherwise)."]
        lt = pick(rows, "models", "DLRM (MLP)", "local table bytes (rank 0)")
        rb = pick(rows, "models", "DLRM (MLP)", prefix="raw best")
        raw_best_t = rb["t"] if rb else None
        if lt:
            md += [f"Its gradsync time also includes the 1/n of `LocalScale::world_size` on rank 0's {lt['tensors']} "
                   f"local tables ({lt['bytes'] / 2**20:.0f} MiB, rows capped at 100,000), registered as "
                   f"`gradsync::RowSparse` of 128 rows a step each, so only those rows are scaled; the raw and "
                   f"per-tensor columns move only the MLP. Target: gradsync <= 1.2x raw MPI of the bytes it "
                   f"sends: {dl['t'] / raw_best_t:.2f}x here." if raw_best_t else ""]
        md += [""]
    printed += md[:]

    # ---- chunk sweep ----
    sweep = [r for r in rows if r["section"] == "chunks" and r["ranks"] == 2]
    if sweep:
        md += ["## Chunk size sweep, 2 ranks (evidence for the default)", "",
               "| model | chunk | gradsync ms | raw ms |", "| --- | --- | --- | --- |"]
        by = collections.OrderedDict()
        for r in sweep:
            kind, size = r["method"].split(" ", 1)
            by.setdefault((r["case"], size), {})[kind] = r["t"]
        for (case, size), v in by.items():
            md.append(f"| {case} | {size} | {ms(v.get('gradsync'))} | {ms(v.get('raw'))} |")
        md.append("")

    # ---- overlap ----
    ov = [r for r in rows if r["section"] == "overlap" and r["ranks"] == 2]
    if ov:
        ov_runs = max(r["runs"] for r in ov)
        runs_note = f" (median of {ov_runs} runs)" if ov_runs > 1 else ""
        md += ["## Overlap with a simulated backward, 2 ranks" + runs_note, "",
               "| model | sync ms (default) | sync ms (blocking) | simulated backward ms | "
               "exposed ms, sync after backward | exposed ms, mark_ready | exposed / sync |",
               "| --- | --- | --- | --- | --- | --- | --- |"]
        for m in MODELS:
            s = pick(rows, "overlap", m, "sync (default)")
            if not s:
                continue
            b = pick(rows, "overlap", m, "backward (simulated)")
            n = pick(rows, "overlap", m, "exposed: sync after backward")
            e = pick(rows, "overlap", m, "exposed: mark_ready")
            bl = pick(rows, "overlap", m, "sync (blocking)")
            line = (f"| {m} | {ms(s['t'])} | {ms(bl['t'] if bl else None)} | {ms(b['t'])} | {ms(n['t'])} | "
                    f"{ms(e['t'])} | {100 * max(e['t'], 0) / s['t']:.0f}% |")
            md.append(line)
        md.append("")
        printed += md[-(len([1 for m in MODELS if pick(rows, 'overlap', m, 'sync (default)')]) + 5):]

    # ---- growth ----
    tens = [r for r in rows if r["section"] == "tensors" and r["ranks"] == 2]
    byt = [r for r in rows if r["section"] == "bytes" and r["ranks"] == 2]
    plot_ok = False
    if tens:
        md += ["## Growth with tensor count (1 KiB tensors), 2 ranks", "",
               "| tensors | gradsync ms | per-tensor ms | raw (same bytes, 2 MiB chunks) ms | gradsync µs per tensor |",
               "| --- | --- | --- | --- | --- |"]
        counts = sorted({r["tensors"] for r in tens})
        g_by = {r["tensors"]: r["t"] for r in tens if r["method"] == "gradsync"}
        for n in counts:
            p = next((r["t"] for r in tens if r["tensors"] == n and r["method"] == "per-tensor"), None)
            w = next((r["t"] for r in tens if r["tensors"] == n and r["method"].startswith("raw")), None)
            md.append(f"| {n} | {ms(g_by.get(n))} | {ms(p)} | {ms(w)} | {1e6 * g_by[n] / n:.2f} |")
        if len(counts) > 1:
            lo, hi = counts[0], counts[-1]
            slope = (g_by[hi] - g_by[lo]) / (hi - lo) * 1e6
            md += ["", f"Per-tensor cost of gradsync (slope from {lo} to {hi} tensors, communication of the extra "
                       f"KiBs included): **{slope:.2f} µs per tensor**.", ""]
    if byt:
        md += ["## Growth with total bytes (256 KiB tensors), 2 ranks", "",
               "| bytes | tensors | gradsync ms | raw 2 MiB chunks ms | gradsync ns/byte | raw ns/byte |",
               "| --- | --- | --- | --- | --- | --- |"]
        sizes = sorted({r["bytes"] for r in byt})
        for b in sizes:
            g = next(r for r in byt if r["bytes"] == b and r["method"] == "gradsync")
            w = next((r for r in byt if r["bytes"] == b and r["method"].startswith("raw")), None)
            md.append(f"| {g['case']} | {g['tensors']} | {ms(g['t'])} | {ms(w['t'] if w else None)} | "
                      f"{1e9 * g['t'] / b:.3f} | " + (f"{1e9 * w['t'] / b:.3f} |" if w else "- |"))
        md.append("")
    if tens and byt:
        with open(os.path.join(out_dir, "bytes.dat"), "w") as f:
            for b in sorted({r["bytes"] for r in byt}):
                g = next(r["t"] for r in byt if r["bytes"] == b and r["method"] == "gradsync")
                w = next((r["t"] for r in byt if r["bytes"] == b and r["method"].startswith("raw")), float("nan"))
                f.write(f"{b / 2**20} {g * 1e3} {w * 1e3}\n")
        with open(os.path.join(out_dir, "tensors.dat"), "w") as f:
            for n in sorted({r["tensors"] for r in tens}):
                v = {r["method"]: r["t"] for r in tens if r["tensors"] == n}
                raw = next((t for k, t in v.items() if k.startswith("raw")), float("nan"))
                f.write(f"{n} {v.get('gradsync', float('nan')) * 1e3} {v.get('per-tensor', float('nan')) * 1e3} "
                        f"{raw * 1e3}\n")
        png = os.path.join(docs_dir, "benchmarks.png")
        gp = f"""
set terminal png size 1200,480 noenhanced
set output '{png}'
set multiplot layout 1,2 title 'gradsync, 2 ranks (see BENCHMARKS.md for the machine and its load)'
set logscale xy
set grid
set key top left
set xlabel 'total bytes (MiB, 256 KiB tensors)'
set ylabel 'time per sync (ms)'
plot '{out_dir}/bytes.dat' u 1:2 w lp t 'gradsync', '' u 1:3 w lp t 'raw MPI_Allreduce, 2 MiB chunks'
set xlabel 'tensor count (1 KiB tensors)'
plot '{out_dir}/tensors.dat' u 1:2 w lp t 'gradsync', '' u 1:3 w lp t 'per-tensor MPI_Allreduce', '' u 1:4 w lp t 'raw, same bytes'
unset multiplot
"""
        try:
            subprocess.run(["gnuplot"], input=gp, text=True, check=True)
            plot_ok = True
        except (OSError, subprocess.CalledProcessError) as e:
            print(f"gnuplot failed: {e}", file=sys.stderr)

    # ---- scaling ----
    ranks = sorted({r["ranks"] for r in rows if r["section"] == "models"})
    if len(ranks) > 1:
        md += ["## Scaling: 1, 2 and 4 ranks", "",
               "4 ranks run oversubscribed on 2 cores (two processes per core): those numbers measure the "
               "scheduler as much as the library.", "",
               "| model | ranks | gradsync ms | raw best ms | per-tensor ms | gradsync / raw |",
               "| --- | --- | --- | --- | --- | --- |"]
        for m in MODELS:
            for n in ranks:
                g = pick(rows, "models", m, "gradsync", ranks=n)
                if not g:
                    continue
                w = pick(rows, "models", m, prefix="raw best", ranks=n)
                p = pick(rows, "models", m, "per-tensor", ranks=n)
                ratio = f"{g['t'] / w['t']:.2f}x" if w and n > 1 else "- (nothing to move)"
                note = " (oversubscribed)" if n > 2 else ""
                md.append(f"| {m} | {n}{note} | {ms(g['t'])} | {ms(w['t'] if w else None)} | "
                          f"{ms(p['t'] if p else None)} | {ratio} |")
        md.append("")

    # ---- callgrind ----
    cg = os.path.join(out_dir, "callgrind.txt")
    if os.path.exists(cg):
        md += ["## Host path instruction count (regression reference)", "", open(cg).read().strip(), ""]
        md += hand_written("host_path_notes.md")  # the count's history
    md += hand_written("step_notes.md")  # the step's reshape and DLRM's MLP (issue 45)
    md += hand_written("samples.md")  # the cost of set_samples()

    doc = ["# gradsync benchmarks", "",
           "Written by `tests/bench/run.sh`; rerun it to refresh this page and `benchmarks.png`.", "",
           "## Command", "", "```sh", command, "```", "",
           "## Machine", "", "```", machine, "```", "",
           "Times are medians over interleaved repetitions (every method once per round, in rotating order), "
           "each repetition timed on the slowest rank; the models at 2 ranks are measured in "
           f"{runs} separate runs (`RUNS`), and each figure is the median of the runs' medians (*raw best*: of "
           "each run's best, labelled with the chunk that won most often). Compare ratios within one table: the "
           "machine is shared and absolute times move with its load (see the load averages above).", "",
           "Methods: **gradsync** is `GradientSync::synchronize()` with default options (average, fused, "
           "float Views, one allocation per tensor as a framework holds them); at its first call it moves the "
           "gradients it reduces in place onto 2 MiB transparent huge pages (`Options::tuning.huge_pages`), and "
           "**gradsync on 4 KiB pages** is the same sync with `huge_pages = false` on a second copy of the "
           "gradients that never was. **raw** is `MPI_Allreduce` "
           "(in place, `MPI_SUM`) of one contiguous buffer of the same bytes cut into chunks of the given "
           "size; *raw best* is the fastest chunk size of the sweep 256 KiB to 16 MiB, timed again after the "
           "sweep, head to head with the other columns (timing it in the samples that chose it would report "
           "the luckiest of seven noisy medians). **raw+avg** adds what "
           "gradsync's default also does, the average: each raw chunk multiplied by 1/n right after its "
           "reduction, while in cache (sweep 1 to 16 MiB); it is the fair baseline of the default, since "
           "a built-in `MPI_SUM` cannot scale and the multiplication is one more pass over the bytes. "
           "**gradsync op=sum** does the same work as raw. **gradsync arena** is the default sync of the same "
           "gradients carved from one `gradsync::GradientArena` in registration order (as DDP's "
           "`gradient_as_bucket_view`): neighbours merge into regions reduced in place, and the arena's host "
           "memory is on 2 MiB transparent huge pages. **raw on huge pages** is raw best on such memory, so "
           "*arena / raw on huge pages* and *gradsync / raw on huge pages* compare the sync alone. **per-tensor** "
           "is one `MPI_Allreduce` per tensor on the program's 4 KiB pages, as a program without gradsync has "
           "them; **per-tensor on huge pages** is the same on the gradients gradsync moved. **DDP gloo** is PyTorch "
           + "DDP (Debian python3-torch, gloo on 127.0.0.1) on a dummy module with the same parameter shapes: "
           "median backward time minus median backward time under `no_sync()`.", ""]
    doc += md
    doc += hand_written("first_call.md")  # written by tests/bench/first_call.sh (its own command and date)
    doc += hand_written("benchmarks_notes.md")
    doc += hand_written("checkpoint.md")  # from tests/bench/checkpoint.sh's runs (issue 33)
    if plot_ok:
        doc += ["## Plot", "", "![time against bytes and against tensor count](benchmarks.png)", ""]
    os.makedirs(docs_dir, exist_ok=True)
    with open(os.path.join(docs_dir, "BENCHMARKS.md"), "w") as f:
        f.write("\n".join(doc) + "\n")
    print("\n".join(printed))
    print(f"\nwrote {os.path.join(docs_dir, 'BENCHMARKS.md')}" + (" and benchmarks.png" if plot_ok else ""))


if __name__ == "__main__":
    main()
