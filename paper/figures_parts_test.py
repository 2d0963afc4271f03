#!/usr/bin/python3
"""paper/figures.py's tables of figures and tables: report.in.md uses exactly the parts they
name, every figure writes the file it shows, and the optional campaigns' parts say when the
campaign was not run (figures_test.sh checks the report as a whole on a larger fixture)."""
import csv
import json
import os
import re
import tempfile
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import figures  # noqa: E402
FIELDS = ["workload", "config", "rep", "rc", "wall_s", "compute_s", "output_sha", "stats",
          "finished_at"]
# The stats JSON of every Stretch run of the fixture: two nodes with these counters each.
STATS = {"nodes": [{"read_faults": 10, "write_faults": 6, "upgrades": 2, "pages_read_ahead": 4,
                    "invalidations_received": 3, "forwards_served": 1, "bytes_sent": 2e6}] * 2}


def write_runs(folder, rows):
    os.makedirs(os.path.join(folder, "stats"), exist_ok=True)
    with open(os.path.join(folder, "runs.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(FIELDS)
        for workload, config, compute_s, stats in rows:
            w.writerow([workload, config, 1, 0, 9.0, compute_s, "x", stats or "", ""])
            if stats:
                with open(os.path.join(folder, "stats", stats), "w") as s:
                    json.dump(STATS, s)


def write_csv(path, header, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def fixture(root, optional):
    """Two workloads in the required campaigns; with `optional`, the fault benchmark (with and
    without busy polling), the manual campaign and a block sweep (blocks out of order) too."""
    write_runs(os.path.join(root, "speedup_2node_tcp"), [
        ("kmeans", "vanilla-cpu0", 2.0, None), ("kmeans", "vanilla-cpu01", 1.0, None),
        ("kmeans", "stretch-2node-tcp", 4.0, "km.json"),
        ("pca", "vanilla-cpu0", 3.0, None), ("pca", "stretch-2node-tcp", 1.5, "pca.json")])
    tm = os.path.join(root, "trace_model")
    os.makedirs(tm)
    write_csv(os.path.join(tm, "validation.csv"),
              ["workload", "work_s", "measured_s", "predicted_s", "error_pct", "loo_predicted_s",
               "loo_error_pct", "measured_speedup"],
              [["kmeans", 2.0, 4.0, 4.4, 10, 4.8, 20, 0.5], ["pca", 3.0, 1.5, 1.5, 0, 1.2, -20, 2]])
    write_csv(os.path.join(tm, "predictions.csv"), ["workload", "network", "nodes", "speedup"],
              [[w, net, n, 1.0] for w in ("kmeans", "pca") for net in ("tcp", "rdma")
               for n in (2, 4)])
    with open(os.path.join(tm, "model_params.json"), "w") as f:
        json.dump({"gamma_us": 50.0, "gamma_rdma_us": 20.0, "ra_weight": 0.5,
                   "rdma_rtt_us": 3.0, "rdma_gbps": 56.0}, f)
    if not optional:
        return
    with open(os.path.join(root, "remote_fault_benchmark.txt"), "w") as f:
        f.write("FLOOR uffd_copy                p50     6.00 p99 1 n 1\n"
                "PROJECT remote_read_miss         p50    80.00 p99 1 n 1 | floor   50.00 = "
                "uffd_copy + 1.0 x tcp_rtt_4k | x\n")
    with open(os.path.join(root, "remote_fault_benchmark_no_poll.txt"), "w") as f:
        f.write("PROJECT remote_read_miss         p50    60.00 p99 1 n 1 | floor   50.00 = "
                "uffd_copy + 1.0 x tcp_rtt_4k | x\n")
    write_runs(os.path.join(root, "manual_2node_tcp"), [
        ("kmeans", "vanilla-cpu0", 2.0, None), ("kmeans", "stretch-manual", 0.5, None)])
    write_runs(os.path.join(root, "block_sweep"), [
        (f"lu@{b}", config, t, f"lu{b}.json" if config != "vanilla-cpu0" else None)
        for b in (512, 64) for config, t in (("vanilla-cpu0", 4.0), ("stretch-2node-tcp", 2.0))])


class FiguresTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.out = os.path.join(self.tmp.name, "out")
        os.makedirs(os.path.join(self.out, "figures"))

    def load(self, optional):
        root = os.path.join(self.tmp.name, "results")
        fixture(root, optional)
        return figures.Results(root)

    def test_the_report_uses_exactly_the_parts_the_tables_name(self):
        with open(os.path.join(HERE, "report.in.md")) as f:
            used = set(re.findall(r"\{\{(\w+)\}\}", f.read()))
        self.assertEqual(used, set(figures.FIGURES) | set(figures.TABLES))
        self.assertTrue(all(n.startswith("fig_") for n in figures.FIGURES))
        self.assertTrue(all(n.startswith("table_") for n in figures.TABLES))

    def test_every_figure_writes_the_file_it_shows(self):
        res = self.load(optional=True)
        for name, draw in figures.FIGURES.items():
            with self.subTest(name):
                m = re.fullmatch(r"!\[([\w.]+)\]\(figures/([\w.]+)\)", draw(res, self.out))
                self.assertIsNotNone(m)
                with open(os.path.join(self.out, "figures", m.group(2)), "rb") as f:
                    self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_every_table_is_a_markdown_table(self):
        res = self.load(optional=True)
        for name, table in figures.TABLES.items():
            with self.subTest(name):
                text = table(res)
                if name == "table_history":  # no history configuration in the fixture
                    self.assertEqual(text, "")
                else:
                    self.assertRegex(text.splitlines()[1], r"^\|(---\|)+$")

    def test_a_campaign_not_run_is_said_and_draws_nothing(self):
        res = self.load(optional=False)
        self.assertEqual(figures.fig_blocks(res, self.out), "(block_sweep was not run)")
        self.assertEqual(figures.table_blocks(res), "(block_sweep was not run)")
        self.assertEqual(figures.table_manual(res), "(manual_2node_tcp was not run)")
        self.assertEqual(figures.fig_latency(res, self.out),
                         "(no benchmark output in the results)")
        self.assertEqual(os.listdir(os.path.join(self.out, "figures")), [])

    def test_block_sweep_rows_are_in_block_order_with_their_speedup(self):
        rows = figures.table_blocks(self.load(optional=True)).splitlines()[2:]
        self.assertEqual(rows, ["| 64 | 512 | 4.000 | 2.000 | 2.00x | 4 | 6 | 20 |",
                                "| 512 | 4096 | 4.000 | 2.000 | 2.00x | 4 | 6 | 20 |"])

    def test_manual_mode_row_is_the_speedup_of_each_mode(self):
        rows = figures.table_manual(self.load(optional=True)).splitlines()[2:]
        self.assertEqual(rows, ["| kmeans | - | 4.00x |"])


if __name__ == "__main__":
    unittest.main()
