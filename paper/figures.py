#!/usr/bin/python3
"""Draws the report's figures and tables from a results folder written by paper/make.

  /usr/bin/python3 paper/figures.py RESULTS [--out=paper]

Reads RESULTS/speedup_2node_tcp, RESULTS/trace_model (with the model's predictions.csv and
validation.csv), RESULTS/remote_fault_benchmark.txt and, if present, RESULTS/manual_2node_tcp
and RESULTS/block_sweep; writes OUT/figures/*.png and OUT/report.md, which is
OUT/report.in.md with every {{name}} replaced by the table or figure of that name.

Each figure is a function of the loaded results (Results) that draws it, writes its file and
returns the markdown that shows it; each table a function that returns its markdown. FIGURES
and TABLES name them all; report.in.md may use no other name.
"""
import argparse
import csv
import json
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "experiments"))
import results  # noqa: E402

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

APPS = ["histogram", "kmeans", "linear_regression", "matrix_multiply", "pca", "string_match",
        "word_count"]
SHORT = {"histogram": "HIST", "kmeans": "KM", "linear_regression": "LR",
         "matrix_multiply": "MM", "pca": "PCA", "string_match": "SM", "word_count": "WC"}
# The thesis's reported speedups against vanilla on one machine (best and worst where it gave
# a range); the others it did not report as numbers.
THESIS = {"matrix_multiply": (3.39, 3.39), "pca": (2.08, 2.08), "kmeans": (0.56, 0.64)}
XS = list(range(len(APPS)))


def fail(msg):
    sys.exit(f"figures.py: {msg}")


def runs(folder):
    if not os.path.exists(results.csv_path(folder)):
        fail(f"{results.csv_path(folder)} does not exist (paper/make runs the campaigns)")
    return results.successful(results.load(folder))


def times(rows, w, label):
    return results.times(rows, w, label)


def speedups(rows, w, base, label):
    """(median speedup, lowest, highest) of label against the base's median."""
    return results.speedup(times(rows, w, base), times(rows, w, label))


def run_stats(folder, rows, w, label):
    """The stats JSON of each run of (w, label) that has one; None where it cannot be read."""
    for r in rows:
        if r["workload"] != w or r["config"] != label or not r["stats"]:
            continue
        try:
            with open(os.path.join(folder, "stats", r["stats"])) as f:
                yield json.load(f)
        except (OSError, ValueError):
            yield None


def node_counts(folder, rows, w, label):
    """Median over runs of the per-run totals (over nodes) of the engine's counters."""
    keys = ["read_faults", "write_faults", "upgrades", "pages_read_ahead",
            "invalidations_received", "forwards_served", "bytes_sent"]
    per_run = []
    for stats in run_stats(folder, rows, w, label):
        if not stats or "nodes" not in stats:
            continue
        per_run.append({k: sum(n.get(k, 0) for n in stats["nodes"]) for k in keys})
    if not per_run:
        return None
    return {k: statistics.median(p[k] for p in per_run) for k in keys}


def bench(path):
    text = open(path).read() if os.path.exists(path) else ""
    project = {m.group(1): (float(m.group(2)), float(m.group(3)))
               for m in re.finditer(r"^PROJECT (\S+)\s+p50\s+([0-9.]+).*\| floor\s+([0-9.]+)",
                                    text, re.M)}
    floors = {m.group(1): float(m.group(2))
              for m in re.finditer(r"^FLOOR (\S+)\s+p50\s+([0-9.]+)", text, re.M)}
    ratios = re.findall(r"^RATIO .*$", text, re.M)
    return project, floors, ratios


class Results:
    """Everything the figures and tables read, loaded once from a results folder. The
    campaigns paper/make may skip (manual_2node_tcp, block_sweep) are None when absent."""

    def __init__(self, folder):
        self.sp_dir = os.path.join(folder, "speedup_2node_tcp")
        self.sp = runs(self.sp_dir)
        tm = os.path.join(folder, "trace_model")
        with open(os.path.join(tm, "validation.csv"), newline="") as f:
            self.val = {r["workload"]: r for r in csv.DictReader(f)}
        with open(os.path.join(tm, "predictions.csv"), newline="") as f:
            self.pred = list(csv.DictReader(f))
        with open(os.path.join(tm, "model_params.json")) as f:
            self.params = json.load(f)
        self.project, self.floors, _ = bench(os.path.join(folder, "remote_fault_benchmark.txt"))
        self.project_np, _, _ = bench(os.path.join(folder, "remote_fault_benchmark_no_poll.txt"))
        self.man_dir = os.path.join(folder, "manual_2node_tcp")
        self.man = runs(self.man_dir) if os.path.exists(results.csv_path(self.man_dir)) else None
        self.bs_dir = os.path.join(folder, "block_sweep")
        self.bs = runs(self.bs_dir) if os.path.exists(results.csv_path(self.bs_dir)) else None


def save(fig, out, name):
    path = os.path.join(out, "figures", name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"![{name}](figures/{name})"


def thesis_markers(ax, xs):
    first = True
    for i, w in enumerate(APPS):
        if w in THESIS:
            lo, hi = THESIS[w]
            ax.plot([xs[i], xs[i]], [lo, hi], color="black", lw=3)
            ax.scatter([xs[i]], [hi], marker="*", s=120, color="black", zorder=5,
                       label="thesis (cluster)" if first else None)
            first = False


def thesis_cell(w):
    th = THESIS.get(w)
    return "-" if not th else (f"{th[0]:.2f}x" if th[0] == th[1] else f"{th[0]:.2f}-{th[1]:.2f}x")


# ---- 1. Measured speedup, 4 threads, 2 emulated nodes over tcp ----------------------------

def adaptive_configs(sp):
    """The adaptive configurations present: first runs, and runs with a placement history;
    each (label, color, legend, table heading)."""
    return [(label, color, name, head) for label, color, name, head in [
        ("stretch-2node-adaptive", "#f96", "Stretch, --placement=adaptive (first run)",
         "Stretch adaptive, first run (range)"),
        ("stretch-2node-adaptive-history", "#6a6",
         "Stretch, adaptive with --placement_history", "Stretch adaptive with history (range)")]
        if any(r["config"] == label for r in sp)]


def fig_speedup_measured(res, out):
    sp = res.sp
    fig, ax = plt.subplots(figsize=(8, 4))
    bars = [("vanilla-cpu01", "#9ab", "vanilla on 2 cores (one machine)"),
            ("stretch-2node-tcp", "#c53", "Stretch, 2 nodes x 1 core, tcp, static placement")]
    bars += [e[:3] for e in adaptive_configs(sp)]
    width = 0.8 / len(bars)
    for i, (label, color, name) in enumerate(bars):
        off = (i - (len(bars) - 1) / 2) * width
        vals = [speedups(sp, w, "vanilla-cpu0", label) for w in APPS]
        ys = [v[0] if v else 0 for v in vals]
        err = [[v[0] - v[1] if v else 0 for v in vals], [v[2] - v[0] if v else 0 for v in vals]]
        ax.bar([x + off for x in XS], ys, width=width, color=color, yerr=err, capsize=3,
               label=name)
    thesis_markers(ax, XS)
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xticks(XS, [SHORT[w] for w in APPS])
    ax.set_ylabel("speedup vs vanilla on 1 core")
    reps = max([len(times(sp, w, label)) for w in APPS for label, _, _ in bars] + [0])
    ax.set_title(f"Measured speedup (4 threads; median of {reps}, bars = range)")
    ax.legend(fontsize=8)
    return save(fig, out, "speedup_measured.png")


def table_speedup_measured(res):
    sp = res.sp
    extra = adaptive_configs(sp)
    table = ["| application | vanilla CPUs 0-1 | Stretch 2 nodes tcp, static (range) | "
             + "".join(f"{e[3]} | " for e in extra) + "thesis |",
             "|---|---|---|" + "---|" * len(extra) + "---|"]

    def cell(v, ranged=True):
        if not v:
            return "-"
        return f"{v[0]:.2f}x ({v[1]:.2f}-{v[2]:.2f})" if ranged else f"{v[0]:.2f}x"

    for w in APPS:
        cells = [cell(speedups(sp, w, "vanilla-cpu0", "vanilla-cpu01"), False),
                 cell(speedups(sp, w, "vanilla-cpu0", "stretch-2node-tcp"))]
        for e in extra:
            cells.append(cell(speedups(sp, w, "vanilla-cpu0", e[0])))
        table.append(f"| {w} | " + " | ".join(cells) + f" | {thesis_cell(w)} |")
    return "\n".join(table)


def history_times(sp_dir, w, label):
    """The run times (ms after the migration point) the placement history of (w, label) holds,
    by kind: distributed, node0."""
    kinds = {"distributed": [], "node0": []}
    try:
        with open(os.path.join(sp_dir, "history", f"{w}-{label}.tsv")) as f:
            for line in f:
                fields = line.rstrip("\n").split("\t")
                if not line.startswith("#") and len(fields) == 6 and fields[1] in kinds:
                    kinds[fields[1]].append(float(fields[2]))
    except OSError:
        pass
    return kinds


def table_history(res):
    """What the placement history chose in the measured runs, and the times it chose from."""
    sp, sp_dir = res.sp, res.sp_dir
    table = ["| application | measured runs: where | distributed, ms after the migration point "
             "(runs) | node 0 alone, ms (runs) |", "|---|---|---|---|"]
    label = "stretch-2node-adaptive-history"

    def ms(v):
        return f"{statistics.median(v):.0f} ({len(v)})" if v else "-"

    for w in APPS if any(r["config"] == label for r in sp) else []:
        where = []
        for stats in run_stats(sp_dir, sp, w, label):
            try:
                where.append(stats["placement"]["history"]["choice"])
            except (TypeError, KeyError):
                where.append("?")
        kinds = history_times(sp_dir, w, label)
        counts = ", ".join(f"{k} {where.count(k)}/{len(where)}" for k in sorted(set(where)))
        table.append(f"| {w} | {counts} | {ms(kinds['distributed'])} | {ms(kinds['node0'])} |")
    return "\n".join(table) if len(table) > 2 else ""


# ---- 2. Fault and invalidation breakdown of the measured 2-node runs ----------------------

def stretch_counts(res):
    return {w: node_counts(res.sp_dir, res.sp, w, "stretch-2node-tcp") for w in APPS}


def fig_faults(res, out):
    fig, ax = plt.subplots(figsize=(8, 4))
    cats = [("read misses", lambda c: c["read_faults"]),
            ("write misses", lambda c: c["write_faults"] - c["upgrades"]),
            ("upgrades S->M", lambda c: c["upgrades"]),
            ("pages read ahead", lambda c: c["pages_read_ahead"]),
            ("invalidations received", lambda c: c["invalidations_received"])]
    counts = stretch_counts(res)
    for i, (name, f) in enumerate(cats):
        ax.bar([x + (i - 2) * 0.16 for x in XS],
               [max(f(counts[w]), 0.5) if counts[w] else 0.5 for w in APPS], width=0.16,
               label=name)
    ax.set_yscale("log")
    ax.set_xticks(XS, [SHORT[w] for w in APPS])
    ax.set_ylabel("count per run (both nodes)")
    ax.set_title("Where the DSM's work goes: Stretch, 2 nodes, tcp (median over runs)")
    ax.legend(fontsize=7, ncol=2)
    return save(fig, out, "fault_breakdown.png")


def table_faults(res):
    sp = res.sp
    table = ["| application | compute s | read misses | write misses | upgrades | read-ahead "
             "pages | invalidations | forwards | MB the nodes sent | us of work per page moved |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    counts = stretch_counts(res)
    for w in APPS:
        c = counts[w]
        t = times(sp, w, "stretch-2node-tcp")
        if not c or not t:
            table.append(f"| {w} | - | - | - | - | - | - | - | - | - |")
            continue
        moved = c["read_faults"] + c["write_faults"] - c["upgrades"] + c["pages_read_ahead"]
        work = times(sp, w, "vanilla-cpu0")
        per_page = f"{statistics.median(work) * 1e6 / moved:.0f}" if work and moved else "-"
        med = statistics.median(t)
        table.append(f"| {w} | {med:.3f} | {c['read_faults']:.0f} | "
                     f"{c['write_faults'] - c['upgrades']:.0f} | {c['upgrades']:.0f} | "
                     f"{c['pages_read_ahead']:.0f} | {c['invalidations_received']:.0f} | "
                     f"{c['forwards_served']:.0f} | {c['bytes_sent'] / 1e6:.1f} | "
                     f"{per_page} |")
    return "\n".join(table)


# ---- 3. Model: validation and extrapolation -----------------------------------------------

def fig_validation(res, out):
    val = res.val
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ms = [float(val[w]["measured_s"]) for w in APPS if w in val]
    ps = [float(val[w]["loo_predicted_s"]) for w in APPS if w in val]
    ax.scatter(ms, ps, color="#c53")
    for w in APPS:
        if w in val:
            ax.annotate(SHORT[w], (float(val[w]["measured_s"]), float(val[w]["loo_predicted_s"])),
                        fontsize=8, xytext=(4, 2), textcoords="offset points")
    lim = [min(ms + ps) * 0.8, max(ms + ps) * 1.25]
    ax.plot(lim, lim, color="gray", ls="--", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured, 2 nodes tcp (s)")
    ax.set_ylabel("predicted, leave-one-out (s)")
    ax.set_title("Model vs measurement (8 threads)")
    return save(fig, out, "model_validation.png")


def table_validation(res):
    val, params = res.val, res.params
    table = ["| application | W: vanilla 1 core s | measured 2 nodes s | predicted s (error) | "
             "leave-one-out predicted s (error) |", "|---|---|---|---|---|"]
    for w in APPS:
        if w in val:
            v = val[w]
            table.append(f"| {w} | {float(v['work_s']):.3f} | {float(v['measured_s']):.3f} | "
                         f"{float(v['predicted_s']):.3f} ({float(v['error_pct']):+.0f}%) | "
                         f"{float(v['loo_predicted_s']):.3f} ({float(v['loo_error_pct']):+.0f}%) |")
    errs = [abs(float(val[w]["loo_error_pct"])) for w in val]
    table.append(f"\nLeave-one-out error: median {statistics.median(errs):.0f}%, largest "
                 f"{max(errs):.0f}%. Fitted CPU cost per protocol event: "
                 f"{params['gamma_us']:.1f} us (tcp), {params['gamma_rdma_us']:.1f} us (RDMA, "
                 f"scaled), a page read ahead {params['ra_weight']:.2f} of an event; RDMA "
                 f"parameters: {params['rdma_rtt_us']} us round trip, "
                 f"{params['rdma_gbps']} Gbit/s.")
    return "\n".join(table)


def model_nodes(res):
    return sorted({int(p["nodes"]) for p in res.pred})


def predicted(res, w, net, n):
    """The model's prediction rows for workload w on n nodes of network net (one, or none)."""
    return [q for q in res.pred if q["workload"] == w and q["network"] == net and
            int(q["nodes"]) == n]


def fig_model(res, out):
    val = res.val
    node_list = model_nodes(res)
    fig, ax = plt.subplots(figsize=(9, 4))
    series = [("measured 2 nodes tcp", None, None)] + [
        (f"model {n} nodes {net}", net, n) for net in ("tcp", "rdma") for n in node_list]
    width = 0.8 / len(series)
    colors = ["#c53", "#fcb", "#f96", "#d63", "#bdf", "#69c", "#236"]
    for i, (name, net, n) in enumerate(series):
        ys = []
        for w in APPS:
            if net is None:
                ys.append(float(val[w]["measured_speedup"]) if w in val else 0)
            else:
                p = predicted(res, w, net, n)
                ys.append(float(p[0]["speedup"]) if p else 0)
        ax.bar([x + (i - len(series) / 2 + 0.5) * width for x in XS], ys, width=width,
               label=name, color=colors[i % len(colors)])
    thesis_markers(ax, XS)
    ax.axhline(1.0, color="gray", lw=0.8, ls="--")
    ax.set_xticks(XS, [SHORT[w] for w in APPS])
    ax.set_ylabel("speedup vs vanilla on 1 core")
    ax.set_yscale("log")
    ax.set_title("Measured and modelled speedup, 1-core nodes (8 threads)")
    ax.legend(fontsize=7, ncol=2)
    return save(fig, out, "speedup_model.png")


def table_model(res):
    val = res.val
    node_list = model_nodes(res)
    head = " | ".join(f"{n} nodes {net}" for net in ("tcp", "rdma") for n in node_list)
    table = [f"| application | measured 2 nodes tcp | {head} | thesis |",
             "|---|---|" + "---|" * (2 * len(node_list)) + "---|"]
    for w in APPS:
        cells = []
        for net in ("tcp", "rdma"):
            for n in node_list:
                p = predicted(res, w, net, n)
                cells.append(f"{float(p[0]['speedup']):.2f}x" if p else "-")
        m = f"{float(val[w]['measured_speedup']):.2f}x" if w in val else "-"
        table.append(f"| {w} | {m} | " + " | ".join(cells) + f" | {thesis_cell(w)} |")
    return "\n".join(table)


# ---- 4. Fault latency microbenchmark beside its floors ------------------------------------

NO_BENCH = "(no benchmark output in the results)"


def fig_latency(res, out):
    project = res.project
    if not project:
        return NO_BENCH
    names = list(project)
    fig, ax = plt.subplots(figsize=(8, 4))
    ys = range(len(names))
    ax.barh([y + 0.2 for y in ys], [project[n][0] for n in names], height=0.4,
            color="#c53", label="Stretch (p50)")
    ax.barh([y - 0.2 for y in ys], [project[n][1] for n in names], height=0.4,
            color="#9ab", label="floor: uffd round trip + k x TCP 4 KiB ping-pong")
    ax.set_yticks(list(ys), names)
    ax.invert_yaxis()
    ax.set_xlabel("microseconds")
    ax.set_title("Fault latency across namespaces over tcp (same run)")
    ax.legend(fontsize=8)
    return save(fig, out, "fault_latency.png")


def table_latency(res):
    project = res.project
    if not project:
        return NO_BENCH
    table = ["| event | Stretch p50 us | floor us | ratio |", "|---|---|---|---|"]
    for n in project:
        table.append(f"| {n} | {project[n][0]:.1f} | {project[n][1]:.1f} | "
                     f"{project[n][0] / project[n][1]:.2f} |")
    table.append("\nFloors measured in the same run: " + ", ".join(
        f"{k} {v:.1f} us" for k, v in res.floors.items()) + ".")
    return "\n".join(table)


def table_latency_no_poll(res):
    """The same benchmark with busy polling off (--busy_poll_us=0): every answer wakes a sleeper."""
    project, project_np = res.project, res.project_np
    if not project_np:
        return "(no benchmark output without polling in the results)"
    table = ["| event | Stretch p50 us, no polling | floor us | ratio | ratio in the run above (default) |",
             "|---|---|---|---|---|"]
    for n in project_np:
        default = (f"{project[n][0] / project[n][1]:.2f}" if project and n in project else "-")
        table.append(f"| {n} | {project_np[n][0]:.1f} | {project_np[n][1]:.1f} | "
                     f"{project_np[n][0] / project_np[n][1]:.2f} | {default} |")
    return "\n".join(table)


# ---- 5. Manual vs automatic mode, when that campaign ran ----------------------------------

def table_manual(res):
    man = res.man
    if man is None:
        return "(manual_2node_tcp was not run)"
    table = ["| application | automatic mode | manual mode |", "|---|---|---|"]
    for w in dict.fromkeys(r["workload"] for r in man):
        cells = []
        for label in ("stretch-auto", "stretch-manual"):
            v = speedups(man, w, "vanilla-cpu0", label)
            cells.append(f"{v[0]:.2f}x" if v else "-")
        table.append(f"| {w} | " + " | ".join(cells) + " |")
    return "\n".join(table)


# ---- 6. Block size of the HPL-style LU against page-granularity sharing -------------------

NO_BLOCKS = "(block_sweep was not run)"


def block_sweep(res):
    """The sweep's workloads in block order, their block sizes, and the median times of
    vanilla and Stretch for each (nan where a configuration has no run)."""
    bs = res.bs
    names = sorted(dict.fromkeys(r["workload"] for r in bs), key=lambda w: int(w.split("@")[1]))
    blocks = [int(w.split("@")[1]) for w in names]
    van = [statistics.median(v) if v else float("nan")
           for v in (times(bs, w, "vanilla-cpu0") for w in names)]
    st = [statistics.median(t) if t else float("nan")
          for t in (times(bs, w, "stretch-2node-tcp") for w in names)]
    return names, blocks, van, st


def fig_blocks(res, out):
    if res.bs is None:
        return NO_BLOCKS
    _, blocks, van, st = block_sweep(res)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(blocks, van, marker="o", color="#9ab", label="vanilla, 1 core")
    ax.plot(blocks, st, marker="s", color="#c53", label="Stretch, 2 nodes x 1 core, tcp, static placement")
    ax.axvline(512, color="gray", ls=":", lw=0.8)
    ax.annotate("block row = one page", (512, max(st + van)), fontsize=8, ha="right")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(blocks, [str(b) for b in blocks])
    ax.set_xlabel("block size B")
    ax.set_ylabel("compute time (s)")
    ax.set_title("Blocked LU, N = 2048: block size vs page granularity")
    ax.legend(fontsize=8)
    return save(fig, out, "block_sweep.png")


def table_blocks(res):
    if res.bs is None:
        return NO_BLOCKS
    names, blocks, van, st = block_sweep(res)
    table = ["| block B | bytes per block row | vanilla 1 core s | Stretch 2 nodes s | speedup | "
             "upgrades | invalidations | read misses |", "|---|---|---|---|---|---|---|---|"]
    for w, b, v, t in zip(names, blocks, van, st):
        c = node_counts(res.bs_dir, res.bs, w, "stretch-2node-tcp")
        table.append(f"| {b} | {8 * b} | {v:.3f} | {t:.3f} | {v / t:.2f}x | "
                     + (f"{c['upgrades']:.0f} | {c['invalidations_received']:.0f} | "
                        f"{c['read_faults']:.0f} |" if c else "- | - | - |"))
    return "\n".join(table)


# Every figure: its name in report.in.md -> fn(results, out) that writes its file.
FIGURES = {
    "fig_speedup_measured": fig_speedup_measured,
    "fig_faults": fig_faults,
    "fig_validation": fig_validation,
    "fig_model": fig_model,
    "fig_latency": fig_latency,
    "fig_blocks": fig_blocks,
}
# Every table: its name in report.in.md -> fn(results) that returns its markdown.
TABLES = {
    "table_speedup_measured": table_speedup_measured,
    "table_history": table_history,
    "table_faults": table_faults,
    "table_validation": table_validation,
    "table_model": table_model,
    "table_latency": table_latency,
    "table_latency_no_poll": table_latency_no_poll,
    "table_manual": table_manual,
    "table_blocks": table_blocks,
}


def parts(res, out):
    """Every figure (drawn into OUT/figures) and table, by name."""
    os.makedirs(os.path.join(out, "figures"), exist_ok=True)
    drawn = {name: fn(res, out) for name, fn in FIGURES.items()}
    return {**drawn, **{name: fn(res) for name, fn in TABLES.items()}}


def fill(template, parts_):
    """`template` with every {{name}} replaced by its part; fails on a name it does not know."""
    missing = set(re.findall(r"\{\{(\w+)\}\}", template)) - set(parts_)
    if missing:
        fail(f"report.in.md names unknown parts: {', '.join(sorted(missing))}")
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts_[m.group(1)], template)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results")
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    a = ap.parse_args()
    p = parts(Results(a.results), a.out)
    with open(os.path.join(a.out, "report.in.md")) as f:
        text = fill(f.read(), p)
    with open(os.path.join(a.out, "report.md"), "w") as f:
        f.write(text)
    print(f"figures.py: wrote {os.path.join(a.out, 'report.md')} and "
          f"{len([n for n in p if n.startswith('fig_')])} figures", file=sys.stderr)


if __name__ == "__main__":
    main()
