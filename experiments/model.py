#!/usr/bin/env python3
"""Trace-driven model: predicts Stretch's speedup for N nodes from fault traces.

  experiments/model.py results/trace_model --bench=results/remote_fault_benchmark.txt
      [--nodes=2,4,8] [--out=DIR]

Input is a campaign of experiments/configs/trace_model.json: per workload, the compute time W
of vanilla on one core (label "vanilla-cpu0"), the measured two-node runs ("stretch-2node-tcp")
and one traced run with every thread on its own node ("trace-9node", no read-ahead), plus the
output of //engine:remote_fault_benchmark for the latency of each kind of fault over tcp.

Replay. With one thread per node every coherence miss a thread can take is in the trace (a
thread's copy of a page is invalidated by any other thread's write). Pages every replica held
from the checkpoint (those whose first fault in the trace is an upgrade) start shared by every
node. Grouping threads onto
fewer nodes can only remove misses (a node's copy is invalidated only by writes of threads
elsewhere), so replaying the merged traces in time order through an MSI directory with the
threads regrouped gives the misses of the grouped placement: read misses (from home or from an
owner), write misses (from home, an owner, or with sharers to invalidate), upgrades with k
sharers, invalidations and forwards each node receives, and the read-ahead the agent would
issue (a thread's read miss on the page after its previous read miss or read-ahead window
asks for the next --read_ahead pages the node does not hold). Placement is stretchd's: main on node 0, workers
round-robin from node 1.

Time. Each worker does W / workers of work. A node with c cores needs
  T_n = max((sum of its workers' work + gamma * E_n) / c,  max over its threads (w_t + S_t))
where E_n counts the protocol events the node handles (its misses, read-aheads, invalidations
and forwards it receives, a page read ahead counting ra_weight of an event: no fault, no
thread to wake), gamma is the CPU time one event costs the node (agent, kernel uffd and network
stack), and S_t is thread t's stall, the sum over its misses of that kind of miss's latency
measured by remote_fault_benchmark. T = max_n T_n and the
predicted speedup is W / T against vanilla on one node.

Validation. gamma and ra_weight are the two fitted parameters: least squares on log(T) over
the measured two-node points. Each workload's error is reported both in-sample and
leave-one-out (fitted on the other workloads), so the reader sees how far off an unseen
workload is.

RDMA. The same replay with each miss's network round trips (tcp_req_4k each, from the
benchmark) replaced by --rdma_rtt_us plus the page at --rdma_gbps, and gamma scaled by the
ratio of the two read-miss latencies. These are parameters, not measurements: this machine has
no RDMA hardware.

Writes DIR/predictions.csv and DIR/validation.csv (default DIR = the results folder) and
prints both as Markdown.
"""
import argparse
import bisect
import csv
import glob
import json
import math
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results  # noqa: E402  (experiments/results.py, also when imported as experiments.model)

PAGE = 4096

# Kinds of miss and the benchmark entry that measures each one's latency.
KINDS = {
    "read": "remote_read_miss",
    "read_owned": "remote_read_miss_owned",
    "write": "remote_write_miss",
    "write_owned": "remote_write_miss_owned",
    "write_sharers": "write_miss_1_sharer",
    "upgrade_1": "upgrade_1_sharer",
    "upgrade_3": "upgrade_3_sharers",
}


def fail(msg):
    sys.exit(f"model.py: {msg}")


def read_trace(trace_dir):
    """Every node's faults merged in time order: (t_ns, thread, page number, access)."""
    files = sorted(glob.glob(os.path.join(trace_dir, "node*.csv")))
    if not files:
        fail(f"no node*.csv fault traces in {trace_dir}")
    events = []
    for path in files:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                try:
                    events.append((int(row["t_ns"]), int(row["thread"]),
                                   int(row["page"], 16) // PAGE, row["access"]))
                except (KeyError, ValueError):
                    fail(f"{path}: malformed line {row}")
    events.sort()
    return events


def placement(threads, nodes):
    """stretchd run's default: main (thread 1) on node 0, the others round-robin from node 1."""
    where = {}
    nxt = 1 if nodes > 1 else 0
    for t in sorted(threads):
        if t == 1:
            where[t] = 0
        else:
            where[t] = nxt
            nxt = (nxt + 1) % nodes
    return where


class Replay:
    """The misses of a placement, counted by replaying a one-thread-per-node trace through an
    MSI directory (owner, sharers per page) with the threads regrouped."""

    def __init__(self, nodes, where, read_ahead):
        self.nodes, self.where, self.read_ahead = nodes, where, read_ahead
        self.owner, self.sharers = {}, {}
        self.last_read_miss = {}               # thread -> page after which a miss is sequential
        self.misses = {}                       # thread -> {kind: count}
        self.events = [0] * nodes              # protocol events each node handles
        self.invalidations = [0] * nodes
        self.forwards = [0] * nodes
        self.read_aheads = [0] * nodes
        self.known_pages = set()

    def node_of(self, thread):
        return self.where.get(thread, 0)       # unknown ids (0: not reported) -> node 0

    def miss(self, thread, kind):
        m = self.misses.setdefault(thread, {})
        m[kind] = m.get(kind, 0) + 1

    def acquire_shared(self, n, page):
        o = self.owner.pop(page, None)
        s = self.sharers.setdefault(page, set())
        if o is not None and o != n:
            self.forwards[o] += 1
            self.events[o] += 1
            s.add(o)
        s.add(n)
        return o is not None and o != n

    def run(self, trace):
        self.known_pages = {e[2] for e in trace}
        # Every replica starts holding the checkpoint's pages read-only (stretchd run
        # --hold_checkpoint): such a page's first fault anywhere is a write to that copy, an
        # upgrade. A page first read or written missing was not held.
        first = {}
        for _, _, page, access in trace:
            first.setdefault(page, access)
        for page, access in first.items():
            if access == "upgrade":
                self.sharers[page] = set(range(self.nodes))
        for _, thread, page, access in trace:
            n = self.node_of(thread)
            owner = self.owner.get(page)
            sharers = self.sharers.get(page, set())
            if access == "read":
                if owner == n or n in sharers:
                    continue
                self.miss(thread, "read_owned" if self.acquire_shared(n, page) else "read")
                self.events[n] += 1
                self.do_read_ahead(n, page, thread)
                continue
            if owner == n:
                continue
            others = [m for m in sharers if m != n]
            if n in sharers:
                kind = "upgrade_%d" % len(others)
            elif owner is not None:
                kind = "write_owned"
                self.forwards[owner] += 1
                self.events[owner] += 1
            elif others:
                kind = "write_sharers"
            else:
                kind = "write"
            for m in others:
                self.invalidations[m] += 1
                self.events[m] += 1
            self.owner[page] = n
            self.sharers[page] = set()
            self.miss(thread, kind)
            self.events[n] += 1
        return self

    def do_read_ahead(self, n, page, thread):
        last, self.last_read_miss[thread] = self.last_read_miss.get(thread), page
        if self.read_ahead <= 0 or last != page - 1:
            return
        for q in range(page + 1, page + 1 + self.read_ahead):
            if q not in self.known_pages:
                return
            self.last_read_miss[thread] = q     # the miss after the window is sequential too
            if self.owner.get(q) == n or n in self.sharers.get(q, set()):
                continue
            self.acquire_shared(n, q)
            self.read_aheads[n] += 1
            self.events[n] += 1


def parse_bench(path):
    """Latency (p50, us) of every PROJECT entry and FLOOR of remote_fault_benchmark's output,
    and how many network round trips each PROJECT entry's floor counts."""
    lat, rtts, floors = {}, {}, {}
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        fail(f"cannot read the benchmark output {path}: {e}")
    for m in re.finditer(r"^PROJECT (\S+)\s+p50\s+([0-9.]+).*?\+ ([0-9.]+) x tcp_rtt_4k", text,
                         re.M):
        lat[m.group(1)] = float(m.group(2))
        rtts[m.group(1)] = float(m.group(3))
    for m in re.finditer(r"^(?:FLOOR|TRANSPORT) (\S+)\s+p50\s+([0-9.]+)", text, re.M):
        floors[m.group(1)] = float(m.group(2))
    missing = [b for b in list(KINDS.values()) + ["tcp_req_4k"] if b not in lat and b not in floors]
    if missing:
        fail(f"{path} lacks {', '.join(missing)} (keep the whole output of "
             "bazel run -c opt //engine:remote_fault_benchmark)")
    return lat, rtts, floors


def latencies(lat, rtts, floors, network="tcp", rdma_rtt_us=3.0, rdma_gbps=56.0):
    """Latency (us) of each kind of miss: measured over tcp, or with each round trip of the
    project's request (tcp_req_4k) replaced by an RDMA round trip carrying the page."""
    out = {}
    for kind, bench in KINDS.items():
        v = lat[bench]
        if network == "rdma":
            per_rtt = rdma_rtt_us + PAGE * 8 / (rdma_gbps * 1e3)
            v = max(v - rtts[bench] * floors["tcp_req_4k"], floors.get("uffd_copy_xproc", 0.0))
            v += rtts[bench] * per_rtt
        out[kind] = v
    return out


def miss_latency(kind, lat):
    if kind.startswith("upgrade_"):
        k = int(kind.split("_")[1])
        if k <= 1:
            return lat["upgrade_1"]
        slope = (lat["upgrade_3"] - lat["upgrade_1"]) / 2
        return lat["upgrade_1"] + slope * (k - 1)
    return lat[kind]


def predict(replay, work_s, lat, gamma_us, cores, workers, ra_weight=1.0):
    """Predicted compute time (s) of a replayed placement (see the module comment); the work is
    shared equally by the threads in `workers`; a page read ahead costs ra_weight events."""
    w = work_s / max(1, len(workers))
    per_node_work = [0.0] * replay.nodes
    critical = [0.0] * replay.nodes
    for t, n in replay.where.items():
        wt = w if t in workers else 0.0
        stall = sum(c * miss_latency(k, lat) for k, c in replay.misses.get(t, {}).items()) / 1e6
        per_node_work[n] += wt
        critical[n] = max(critical[n], wt + stall)
    return max(max((per_node_work[n] + gamma_us * (replay.events[n] - (1 - ra_weight) *
                                                   replay.read_aheads[n]) / 1e6) / cores,
                   critical[n])
               for n in range(replay.nodes))


def golden(err, lo, hi, steps=60):
    """The x in [lo, hi] minimizing err (unimodal)."""
    for _ in range(steps):
        a = lo + (hi - lo) * 0.382
        b = lo + (hi - lo) * 0.618
        if err(a) <= err(b):
            hi = b
        else:
            lo = a
    return (lo + hi) / 2


def log_error(points, *params):
    return sum((math.log(f(*params)) - math.log(m)) ** 2 for f, m in points)


def fit_gamma(points, lo=0.0, hi=2000.0):
    """gamma (us) minimizing the squared log error of [(predict(gamma) -> s, measured s)]."""
    return golden(lambda g: log_error(points, g), lo, hi, steps=100)


def fit(points):
    """(gamma, ra_weight) minimizing the squared log error of [(predict(gamma, ra_weight) -> s,
    measured s)]: the CPU one protocol event costs a node, and the share of that a page read
    ahead costs (no fault, no thread to wake)."""
    def best_gamma(r):
        return fit_gamma([(lambda g, f=f, r=r: f(g, r), m) for f, m in points])
    r = golden(lambda r: log_error(points, best_gamma(r), r), 0.0, 1.0, steps=30)
    return best_gamma(r), r


def load_campaign(folder):
    if not os.path.exists(results.csv_path(folder)):
        fail(f"{results.csv_path(folder)} does not exist "
             "(experiments/run.py experiments/configs/trace_model.json)")
    by = {}
    for r in results.successful(results.load(folder)):
        by.setdefault((r["workload"], r["config"]), []).append(r)
    return by


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="results folder of the trace_model campaign")
    ap.add_argument("--bench", required=True, help="saved output of remote_fault_benchmark")
    ap.add_argument("--nodes", default="2,4,8", help="node counts to predict")
    ap.add_argument("--cores", type=int, default=1, help="cores per node (the emulation: 1)")
    ap.add_argument("--read_ahead", type=int, default=8, help="the agent's --read_ahead")
    ap.add_argument("--rdma_rtt_us", type=float, default=3.0,
                    help="RDMA round trip of a request and its reply, us (parameter)")
    ap.add_argument("--rdma_gbps", type=float, default=56.0,
                    help="RDMA link bandwidth, Gbit/s (parameter)")
    ap.add_argument("--out", help="where to write predictions.csv and validation.csv")
    a = ap.parse_args()
    try:
        node_counts = [int(x) for x in a.nodes.split(",")]
    except ValueError:
        fail(f"--nodes must be a comma-separated list of integers, not '{a.nodes}'")
    if any(n < 1 for n in node_counts) or a.cores < 1:
        fail("--nodes and --cores must be positive")
    out = a.out or a.results
    os.makedirs(out, exist_ok=True)
    bench = parse_bench(a.bench)
    tcp = latencies(*bench)
    rdma = latencies(*bench, network="rdma", rdma_rtt_us=a.rdma_rtt_us, rdma_gbps=a.rdma_gbps)
    by = load_campaign(a.results)

    workloads, traces, work, measured = [], {}, {}, {}
    for w in dict.fromkeys(k[0] for k in by):
        base = by.get((w, "vanilla-cpu0"))
        tr = glob.glob(os.path.join(a.results, "traces", f"{w}-trace-9node-*"))
        if not base or not tr:
            print(f"model.py: {w}: no vanilla-cpu0 run or no trace, skipped", file=sys.stderr)
            continue
        workloads.append(w)
        work[w] = statistics.median(results.time_of(r) for r in base)
        traces[w] = read_trace(sorted(tr)[0])
        m = by.get((w, "stretch-2node-tcp"))
        if m:
            measured[w] = statistics.median(results.time_of(r) for r in m)
    if not workloads:
        fail(f"no workload in {a.results} has both a vanilla-cpu0 run and a trace")

    try:
        with open(os.path.join(a.results, "config.json")) as f:
            c = json.load(f)
        trace_cfg = next(x for x in c["configs"] if x["label"] == "trace-9node")
        workers = int(trace_cfg.get("threads", c.get("threads", 4)))
    except (OSError, ValueError, KeyError, StopIteration):
        fail(f"{a.results}/config.json has no trace-9node configuration")

    worker_ids = set(range(2, workers + 2))

    def replay(w, nodes, read_ahead):
        # Main is thread 1, the workers 2..workers+1 (also those that never faulted).
        threads = set(range(1, workers + 2)) | {e[1] for e in traces[w] if e[1] > 0}
        return Replay(nodes, placement(threads, nodes), read_ahead).run(traces[w])

    two = {w: replay(w, 2, a.read_ahead) for w in measured}

    def point(w):
        return ((lambda g, r, w=w: predict(two[w], work[w], tcp, g, a.cores, worker_ids, r)),
                measured[w])

    valid = [w for w in workloads if w in measured]
    if not valid:
        fail("no measured stretch-2node-tcp runs to fit and validate against")
    gamma, ra_weight = fit([point(w) for w in valid])
    rows = []
    for w in valid:
        loo = fit([point(v) for v in valid if v != w]) if len(valid) > 2 else (gamma, ra_weight)
        p_in = predict(two[w], work[w], tcp, gamma, a.cores, worker_ids, ra_weight)
        p_loo = predict(two[w], work[w], tcp, loo[0], a.cores, worker_ids, loo[1])
        rows.append({"workload": w, "work_s": f"{work[w]:.4f}",
                     "measured_s": f"{measured[w]:.4f}",
                     "predicted_s": f"{p_in:.4f}", "error_pct": f"{(p_in / measured[w] - 1) * 100:.1f}",
                     "loo_gamma_us": f"{loo[0]:.1f}", "loo_ra_weight": f"{loo[1]:.3f}",
                     "loo_predicted_s": f"{p_loo:.4f}",
                     "loo_error_pct": f"{(p_loo / measured[w] - 1) * 100:.1f}",
                     "measured_speedup": f"{work[w] / measured[w]:.3f}",
                     "predicted_speedup": f"{work[w] / p_in:.3f}"})
    with open(os.path.join(out, "validation.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)

    preds = []
    gamma_rdma = gamma * rdma["read"] / tcp["read"]
    for w in workloads:
        for nodes in node_counts:
            r = replay(w, nodes, a.read_ahead)
            misses = sum(sum(m.values()) for m in r.misses.values())
            for net, lat, g in (("tcp", tcp, gamma), ("rdma", rdma, gamma_rdma)):
                t = predict(r, work[w], lat, g, a.cores, worker_ids, ra_weight)
                preds.append({"workload": w, "network": net, "nodes": nodes, "cores": a.cores,
                              "predicted_s": f"{t:.4f}", "speedup": f"{work[w] / t:.3f}",
                              "misses": misses, "invalidations": sum(r.invalidations),
                              "forwards": sum(r.forwards), "read_aheads": sum(r.read_aheads)})
    with open(os.path.join(out, "predictions.csv"), "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(preds[0]))
        wr.writeheader()
        wr.writerows(preds)
    params = {"gamma_us": gamma, "ra_weight": ra_weight, "gamma_rdma_us": gamma_rdma,
              "cores_per_node": a.cores,
              "read_ahead": a.read_ahead, "rdma_rtt_us": a.rdma_rtt_us,
              "rdma_gbps": a.rdma_gbps, "latency_tcp_us": tcp, "latency_rdma_us": rdma}
    with open(os.path.join(out, "model_params.json"), "w") as f:
        json.dump(params, f, indent=1)

    print(f"Model: gamma = {gamma:.1f} us of node CPU per protocol event, a page read ahead "
          f"{ra_weight:.2f} of that (fitted on {len(valid)} measured 2-node points); RDMA: "
          f"{a.rdma_rtt_us} us round trip, "
          f"{a.rdma_gbps} Gbit/s, gamma {gamma_rdma:.1f} us\n")
    print("| workload | W (1 core) s | measured 2-node s | predicted s | error | "
          "leave-one-out error |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['workload']} | {r['work_s']} | {r['measured_s']} | {r['predicted_s']} | "
              f"{r['error_pct']}% | {r['loo_error_pct']}% |")
    print("\n| workload | " + " | ".join(f"{n} nodes {net}" for net in ("tcp", "rdma")
                                       for n in node_counts) + " |")
    print("|---|" + "---|" * (2 * len(node_counts)))
    for w in workloads:
        cells = [next(p["speedup"] for p in preds if p["workload"] == w and p["network"] == net
                      and p["nodes"] == n) for net in ("tcp", "rdma") for n in node_counts]
        print(f"| {w} | " + " | ".join(f"{c}x" for c in cells) + " |")


if __name__ == "__main__":
    main()
