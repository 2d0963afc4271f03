#!/usr/bin/env python3
"""corpus.json is well formed: unique names, known sources and inputs, a valid comparison, and
at least what the corpus must hold (12 programs from 4 sources, 3 OpenMP programs, the seven
OpenMP workloads, OpenBLAS)."""
import json
import os
import re
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import corpus_programs  # noqa: E402
import gen_inputs  # noqa: E402

with open(os.path.join(HERE, "corpus.json")) as f:
    PROGRAMS = json.load(f)["programs"]


class CorpusTest(unittest.TestCase):
    def test_entries_are_complete_and_names_unique(self):
        names = [p["name"] for p in PROGRAMS]
        self.assertEqual(len(names), len(set(names)))
        for p in PROGRAMS:
            for key in ("name", "source", "what", "argv", "compare"):
                self.assertIn(key, p, p["name"])
            self.assertRegex(p["source"], r"^(debian:[a-z0-9.+-]+|openblas|workloads-omp)$")
            self.assertTrue(set(p) <= {"name", "source", "what", "inputs", "prepare", "env",
                                       "argv", "compare"}, p["name"])

    def test_inputs_are_generated_and_comparisons_valid(self):
        for p in PROGRAMS:
            for i in p.get("inputs", []):
                self.assertIn(i, gen_inputs.GENERATORS, p["name"])
            c = p["compare"]
            if isinstance(c, dict):
                self.assertEqual(set(c), {"keep"})
                re.compile(c["keep"])
            else:
                self.assertIn(c, ("exact", "md5"))
            if "prepare" in p:
                self.assertEqual(set(p["prepare"]), {"creates", "sh"})
                self.assertIn("> " + p["prepare"]["creates"], p["prepare"]["sh"])

    def test_holds_what_the_corpus_must(self):
        self.assertGreaterEqual(len(PROGRAMS), 12)
        self.assertGreaterEqual(len({p["source"] for p in PROGRAMS}), 4)
        omp = [p for p in PROGRAMS if "OMP_NUM_THREADS" in p.get("env", {})
               or p["source"] == "workloads-omp"]
        self.assertGreaterEqual(len(omp), 3)
        self.assertEqual(
            sorted(p["name"] for p in PROGRAMS if p["source"] == "workloads-omp"),
            sorted(w + "_omp" for w in ("histogram", "kmeans", "linear_regression",
                                         "matrix_multiply", "pca", "string_match",
                                         "word_count")))
        self.assertTrue(any(p["source"] == "openblas" for p in PROGRAMS))


class CorpusProgramsTest(unittest.TestCase):
    """What tools/corpus and tools/soak take from corpus_programs."""

    def test_only_selects_and_an_unknown_name_is_an_error(self):
        self.assertEqual([p["name"] for p in corpus_programs.load("xz,pigz")], ["pigz", "xz"])
        self.assertEqual(len(corpus_programs.load()), len(PROGRAMS))
        with self.assertRaisesRegex(corpus_programs.Error, r"unknown program\(s\) nosuch; known: "):
            corpus_programs.load("xz,nosuch")

    def test_command_fills_in_the_build_directories_and_the_environment(self):
        tmp = os.environ.get("TEST_TMPDIR", "/tmp")
        exe = os.path.join(tmp, "kmeans_omp")
        with open(exe, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(exe, 0o755)
        prog = {"argv": ["{workloads}/kmeans_omp", "--threads=2"], "env": {"X_CORPUS": "1"}}
        argv, env = corpus_programs.command(prog, {"workloads": tmp, "corpus": "/nowhere"})
        self.assertEqual(argv, [exe, "--threads=2"])
        self.assertEqual(env["X_CORPUS"], "1")
        with self.assertRaisesRegex(corpus_programs.Error, r"/nowhere/dgemm not found"):
            corpus_programs.command({"argv": ["{corpus}/dgemm"]}, {"corpus": "/nowhere"})

    def test_digest_compares_all_of_the_output_or_only_the_kept_lines(self):
        tmp = os.environ.get("TEST_TMPDIR", "/tmp")
        a, b = os.path.join(tmp, "a.out"), os.path.join(tmp, "b.out")
        with open(a, "w") as f:
            f.write("info depth 1 time 5\nbestmove e2e4 ponder e7e5\n")
        with open(b, "w") as f:
            f.write("info depth 1 time 9\nbestmove e2e4 ponder d7d5\n")
        keep = {"keep": "^bestmove [a-h1-8]+"}
        self.assertEqual(corpus_programs.digest(a, keep), corpus_programs.digest(b, keep))
        self.assertNotEqual(corpus_programs.digest(a, "md5"), corpus_programs.digest(b, "md5"))


if __name__ == "__main__":
    unittest.main()
