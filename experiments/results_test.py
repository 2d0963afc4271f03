"""experiments/results.py: the one loader and speedup rule."""
import os
import tempfile
import unittest

from experiments import results


def row(workload, config, rc, wall, compute):
    return {"workload": workload, "config": config, "rep": "1", "rc": str(rc), "wall_s": str(wall),
            "compute_s": "" if compute is None else str(compute), "output_sha": "x", "stats": "",
            "finished_at": ""}


class ResultsTest(unittest.TestCase):
    def test_time_is_compute_time_else_wall_time(self):
        self.assertEqual(results.time_of(row("a", "c", 0, 5.0, 2.0)), 2.0)
        self.assertEqual(results.time_of(row("a", "c", 0, 5.0, None)), 5.0)

    def test_only_successful_runs_count(self):
        rows = [row("a", "c", 0, 1, 1), row("a", "c", 1, 9, 9), row("b", "c", 0, 2, 2)]
        self.assertEqual(results.times(results.successful(rows), "a", "c"), [1.0])

    def test_speedup_is_median_against_median_with_its_range(self):
        self.assertEqual(results.speedup([2.0, 2.0, 2.0], [1.0, 1.25, 0.8]), (2.0, 1.6, 2.5))
        self.assertIsNone(results.speedup([], [1.0]))
        self.assertIsNone(results.speedup([1.0], []))
        self.assertIsNone(results.speedup([1.0], [0.0]))
        self.assertEqual(results.speedup([1.0], [0.0, 1.0, 2.0])[2], float("inf"))

    def test_load_reads_the_campaigns_runs_in_order(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "runs.csv"), "w") as f:
                f.write(",".join(results.FIELDS) + "\n")
                f.write("kmeans,vanilla-cpu0,1,0,1.5,1.2,x,,\n")
                f.write("kmeans,stretch,1,1,3.0,,y,s.json,\n")
            rows = results.load(d)
            self.assertEqual([r["config"] for r in rows], ["vanilla-cpu0", "stretch"])
            self.assertEqual(len(results.successful(rows)), 1)
        with self.assertRaises(FileNotFoundError):
            results.load("/nonexistent-campaign")


if __name__ == "__main__":
    unittest.main()
