"""Tests of the trace-driven model (experiments/model.py) on synthetic traces whose misses and
times can be counted by hand."""
import os
import subprocess
import sys
import tempfile
import unittest

from experiments import model

PAGE = model.PAGE

LAT = {"read": 80.0, "read_owned": 110.0, "write": 80.0, "write_owned": 120.0,
       "write_sharers": 130.0, "upgrade_1": 125.0, "upgrade_3": 225.0}


def trace(*events):
    """(thread, page number, access) in time order -> the replay's input."""
    return [(i, t, p, a) for i, (t, p, a) in enumerate(events)]


def replay(events, nodes, read_ahead=0, threads=(1, 2, 3)):
    return model.Replay(nodes, model.placement(set(threads), nodes), read_ahead).run(events)


def total(r, kind=None):
    return sum(c for m in r.misses.values() for k, c in m.items() if kind in (None, k))


class PlacementTest(unittest.TestCase):
    def test_main_on_node0_workers_round_robin_from_node1(self):
        self.assertEqual(model.placement({1, 2, 3, 4, 5}, 2), {1: 0, 2: 1, 3: 0, 4: 1, 5: 0})
        self.assertEqual(model.placement({1, 2, 3}, 1), {1: 0, 2: 0, 3: 0})
        self.assertEqual(model.placement({1, 2, 3, 4}, 4), {1: 0, 2: 1, 3: 2, 4: 3})


class ReplayTest(unittest.TestCase):
    def test_ping_pong_between_nodes_misses_every_write(self):
        events = trace(*[(2 + i % 2, 7, "write") for i in range(100)])
        r = replay(events, 3)        # thread 2 on node 1, thread 3 on node 2
        self.assertEqual(total(r, "write"), 1)           # the first, from the home copy
        self.assertEqual(total(r, "write_owned"), 99)
        self.assertEqual(sum(r.forwards), 99)

    def test_ping_pong_within_a_node_misses_once(self):
        events = trace(*[(2 + i % 2, 7, "write") for i in range(100)])
        r = replay(events, 1)
        self.assertEqual(total(r), 1)
        self.assertEqual(sum(r.forwards) + sum(r.invalidations), 0)

    def test_read_sharing_then_write_invalidates_the_readers(self):
        events = trace((2, 5, "write"), (3, 5, "read"), (1, 5, "read"), (2, 5, "upgrade"))
        r = replay(events, 3)        # main on 0, thread 2 on 1, thread 3 on 2
        self.assertEqual(r.misses[2], {"write": 1, "upgrade_2": 1})
        self.assertEqual(r.misses[3], {"read_owned": 1})
        self.assertEqual(r.misses[1], {"read": 1})
        self.assertEqual(r.invalidations, [1, 0, 1])
        self.assertEqual(r.forwards, [0, 1, 0])

    def test_fewer_nodes_never_add_misses(self):
        events = trace((2, 1, "read"), (3, 1, "read"), (3, 1, "upgrade"), (2, 1, "read"),
                       (1, 2, "write"), (2, 2, "read"), (3, 2, "write"), (1, 2, "read"))
        counts = [total(replay(events, n)) for n in (3, 2, 1)]
        self.assertEqual(counts, sorted(counts, reverse=True))
        # One node: the first touch of each page, and page 1's read copy made writable.
        self.assertEqual(counts[-1], 3)

    def test_pages_held_from_the_checkpoint_start_shared_by_every_node(self):
        # Page 5's first fault is an upgrade: every replica held it. Page 6 was missing.
        events = trace((2, 5, "upgrade"), (3, 5, "read"), (2, 6, "write"), (3, 6, "read"))
        r = replay(events, 3)
        self.assertEqual(r.misses[2], {"upgrade_2": 1, "write": 1})
        self.assertEqual(r.misses[3], {"read_owned": 2})
        self.assertEqual(r.invalidations, [1, 0, 1])
        # On one node the held page is written without a transfer (an upgrade, alone).
        self.assertEqual(replay(events, 1).misses[2], {"upgrade_0": 1, "write": 1})

    def test_read_ahead_after_two_sequential_misses(self):
        events = trace(*[(2, p, "read") for p in range(10, 20)])
        plain = replay(events, 2)
        ahead = replay(events, 2, read_ahead=4)
        self.assertEqual(total(plain), 10)
        # 10, 11 miss; 11 follows 10, so 12-15 are read ahead; 16 follows that window and
        # misses, with 17-19 read ahead (20 is not a page of the trace).
        self.assertEqual(total(ahead), 3)
        self.assertEqual(sum(ahead.read_aheads), 7)

    def test_read_ahead_follows_each_thread(self):
        # Threads 2 and 4 (both on node 1) scan their own slices side by side.
        events = trace(*[e for p in range(8) for e in ((2, 100 + p, "read"), (4, 200 + p, "read"))])
        r = replay(events, 2, read_ahead=4, threads=(1, 2, 3, 4))
        self.assertEqual(r.misses[2], {"read": 3})       # 100, 101 (102-105 ahead), 106 (107)
        self.assertEqual(r.misses[4], {"read": 3})
        self.assertEqual(sum(r.read_aheads), 10)


class TimeTest(unittest.TestCase):
    def test_no_misses_is_the_work_divided_over_the_nodes(self):
        r = replay([], 3, threads=(1, 2, 3, 4, 5))       # 2 workers on each of nodes 1, 2 + 0
        t = model.predict(r, 8.0, LAT, 50.0, cores=1, workers={2, 3, 4, 5})
        self.assertAlmostEqual(t, 4.0)                   # node 1 runs workers 2 and 5
        t2 = model.predict(r, 8.0, LAT, 50.0, cores=2, workers={2, 3, 4, 5})
        self.assertAlmostEqual(t2, 2.0)

    def test_misses_cost_node_cpu_and_stall_the_thread(self):
        events = trace(*[(2 + i % 2, 7, "write") for i in range(100)])
        r = replay(events, 3)
        # Node 1: thread 2's 50 misses + the 50 forwards it served = 100 events at 100 us;
        # each thread is alone on its node: the larger of 1 s + 10 ms and 1 s + its stall.
        t = model.predict(r, 2.0, LAT, 100.0, cores=1, workers={2, 3})
        stall2 = (LAT["write"] + 49 * LAT["write_owned"]) / 1e6
        stall3 = 50 * LAT["write_owned"] / 1e6
        self.assertAlmostEqual(t, max(1.0 + 100 * 100e-6, 1.0 + stall2, 1.0 + stall3))

    def test_upgrade_latency_grows_with_sharers(self):
        self.assertEqual(model.miss_latency("upgrade_0", LAT), LAT["upgrade_1"])
        self.assertEqual(model.miss_latency("upgrade_3", LAT), LAT["upgrade_3"])
        self.assertGreater(model.miss_latency("upgrade_7", LAT), LAT["upgrade_3"])

    def test_fit_recovers_the_cost_per_event(self):
        points = []
        for n in (10, 100, 1000):
            events = trace(*[(2 + i % 2, 7, "write") for i in range(n)])
            r = replay(events, 2, threads=(1, 2, 3))     # threads 2, 3 on nodes 1, 0
            def f(g, r=r):
                return model.predict(r, 1.0, LAT, g, cores=1, workers={2, 3})
            points.append((f, f(150.0)))
        self.assertAlmostEqual(model.fit_gamma(points), 150.0, places=2)

    def test_fit_recovers_the_cost_of_a_miss_and_of_a_read_ahead(self):
        replays = [replay(trace(*[(2 + i % 2, 7, "write") for i in range(n)]), 2)
                   for n in (100, 1000)]
        replays += [replay(trace(*[(2, p, "read") for p in range(n)]), 2, read_ahead=8)
                    for n in (500, 2000)]
        points = []
        for r in replays:
            def f(g, ra, r=r):
                return model.predict(r, 1.0, LAT, g, cores=1, workers={2, 3}, ra_weight=ra)
            points.append((f, f(150.0, 0.3)))
        gamma, ra_weight = model.fit(points)
        self.assertAlmostEqual(gamma, 150.0, delta=0.5)
        self.assertAlmostEqual(ra_weight, 0.3, delta=0.005)


BENCH = """\
FLOOR uffd_copy                p50     6.00 p99    15.28 n 1800
FLOOR uffd_copy_xproc          p50     8.00 p99    17.40 n 1800
FLOOR tcp_rtt_4k               p50    40.00 p99    82.25 n 1800
FLOOR tcp_req_4k               p50    42.00 p99    80.99 n 1800
PROJECT remote_read_miss         p50    80.00 p99 1 n 1 | floor   46.00 = uffd_copy + 1.0 x tcp_rtt_4k | x
PROJECT remote_write_miss        p50    81.00 p99 1 n 1 | floor   46.00 = uffd_copy + 1.0 x tcp_rtt_4k | x
PROJECT upgrade_1_sharer         p50   126.00 p99 1 n 1 | floor   86.00 = uffd_copy + 2.0 x tcp_rtt_4k | x
PROJECT upgrade_3_sharers        p50   231.00 p99 1 n 1 | floor   86.00 = uffd_copy + 2.0 x tcp_rtt_4k | x
PROJECT remote_read_miss_owned   p50   112.00 p99 1 n 1 | floor   66.00 = uffd_copy + 1.5 x tcp_rtt_4k | x
PROJECT remote_write_miss_owned  p50   123.00 p99 1 n 1 | floor   66.00 = uffd_copy + 1.5 x tcp_rtt_4k | x
PROJECT write_miss_1_sharer      p50   129.00 p99 1 n 1 | floor   66.00 = uffd_copy + 1.5 x tcp_rtt_4k | x
"""


class BenchTest(unittest.TestCase):
    def test_parses_latencies_and_replaces_the_network_for_rdma(self):
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
            f.write(BENCH)
            f.flush()
            bench = model.parse_bench(f.name)
        tcp = model.latencies(*bench)
        self.assertEqual(tcp["read_owned"], 112.0)
        rdma = model.latencies(*bench, network="rdma", rdma_rtt_us=3.0, rdma_gbps=56.0)
        page_us = PAGE * 8 / 56e3
        # read miss: 80 - 1 x 42 (tcp request) + 1 x (3 + page time)
        self.assertAlmostEqual(rdma["read"], 80 - 42 + 3 + page_us)
        self.assertTrue(all(rdma[k] < tcp[k] for k in tcp))

    def test_incomplete_benchmark_output_is_refused(self):
        with tempfile.NamedTemporaryFile("w", suffix=".txt") as f:
            f.write(BENCH.split("PROJECT upgrade_1")[0])
            f.flush()
            p = subprocess.run([sys.executable, model.__file__, os.path.dirname(f.name),
                                "--bench=" + f.name], capture_output=True, text=True)
        self.assertEqual(p.returncode, 1)
        self.assertRegex(p.stderr, r"^model.py: .* lacks .*upgrade_1_sharer")


if __name__ == "__main__":
    unittest.main()
