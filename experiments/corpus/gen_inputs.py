#!/usr/bin/env python3
"""Writes the corpus's input files into a work directory, deterministically (fixed seeds of
Python's random.Random, whose sequence is stable across Python versions for these calls).

  gen_inputs.py --work_dir=DIR [NAME ...]     (default: every input)

Each input is written once: a file that exists with the size recorded in DIR/inputs.json for
its generator version is kept. Inputs:
  text       text.txt, 84 MB of Zipf-distributed words (compressors)
  text24     t24.txt, its first 24 MB (xz)
  image      image.ppm, 640x480 RGB (GraphicsMagick)
  alignment  alignment.fa, 250 nucleotide sequences of 600 sites from a random mutation tree
             (FastTree)
  genome     ref.fa (4 Mbp) and reads.fa (3000 long reads with 8 % errors, half reverse
             complemented) (minimap2)
  matrices   matrices.bin, two 2000 x 2000 matrices of multiples of 1/64 in [-1, 1] (dgemm.c)
  positions  positions.fen, three chess positions with one clearly best move (Stockfish)
"""
import argparse
import array
import json
import os
import random
import struct
import sys

VERSION = 1


def gen_text(d):
    r = random.Random(1)
    letters = "abcdefghijklmnopqrstuvwxyz"
    vocab = ["".join(r.choice(letters) for _ in range(r.randint(2, 10))) for _ in range(5000)]
    weights = [1.0 / (i + 1) for i in range(len(vocab))]
    with open(os.path.join(d, "text.txt"), "w") as f:
        for _ in range(100):
            words = r.choices(vocab, weights=weights, k=120000)
            f.write("\n".join(" ".join(words[i:i + 12]) for i in range(0, len(words), 12)))
            f.write("\n")
    return ["text.txt"]


def gen_text24(d):
    if not os.path.exists(os.path.join(d, "text.txt")):
        gen_text(d)
    with open(os.path.join(d, "text.txt"), "rb") as src:
        data = src.read(24000000)
    with open(os.path.join(d, "t24.txt"), "wb") as f:
        f.write(data)
    return ["t24.txt"]


def gen_image(d):
    r = random.Random(2)
    w, h = 640, 480
    px = bytearray()
    for y in range(h):
        for x in range(w):
            px += bytes((((x * 255) // w) ^ r.randrange(32), (y * 255) // h,
                         (x + y + r.randrange(64)) & 255))
    with open(os.path.join(d, "image.ppm"), "wb") as f:
        f.write(b"P6\n%d %d\n255\n" % (w, h) + bytes(px))
    return ["image.ppm"]


def gen_alignment(d):
    r = random.Random(3)
    sites, n = 600, 250
    seqs = [[r.choice("ACGT") for _ in range(sites)]]
    while len(seqs) < n:
        child = list(r.choice(seqs))
        for _ in range(r.randint(5, 40)):
            child[r.randrange(sites)] = r.choice("ACGT")
        seqs.append(child)
    with open(os.path.join(d, "alignment.fa"), "w") as f:
        for i, s in enumerate(seqs):
            f.write(">s%d\n%s\n" % (i, "".join(s)))
    return ["alignment.fa"]


def gen_genome(d):
    r = random.Random(4)
    size = 4000000
    ref = "".join(r.choice("ACGT") for _ in range(size))
    with open(os.path.join(d, "ref.fa"), "w") as f:
        f.write(">chr1\n")
        for i in range(0, size, 80):
            f.write(ref[i:i + 80] + "\n")
    comp = {"A": "T", "C": "G", "G": "C", "T": "A"}
    with open(os.path.join(d, "reads.fa"), "w") as f:
        for k in range(3000):
            length = r.randint(2000, 8000)
            p = r.randrange(size - length)
            s = list(ref[p:p + length])
            for _ in range(length // 12):
                j = r.randrange(len(s))
                op = r.random()
                if op < 0.6:
                    s[j] = r.choice("ACGT")
                elif op < 0.8:
                    del s[j]
                else:
                    s.insert(j, r.choice("ACGT"))
            read = "".join(s)
            if r.random() < 0.5:
                read = "".join(comp[c] for c in reversed(read))
            f.write(">r%d\n%s\n" % (k, read))
    return ["ref.fa", "reads.fa"]


def gen_matrices(d):
    r = random.Random(5)
    n = 2000
    with open(os.path.join(d, "matrices.bin"), "wb") as f:
        f.write(struct.pack("<q", n))
        for _ in range(2):
            m = array.array("d", (r.randint(-64, 64) / 64.0 for _ in range(n * n)))
            if sys.byteorder != "little":
                m.byteswap()
            m.tofile(f)
    return ["matrices.bin"]


def gen_positions(d):
    # Scholar's mate (Qxf7#), a queen left en prise to a knight (Nxh4), a back-rank mate (Rd8#).
    fens = [
        "r1bqkb1r/pppp1ppp/2n2n2/4p2Q/2B1P3/8/PPPP1PPP/RNB1K1NR w KQkq - 4 4",
        "rnb1kbnr/pppp1ppp/8/4p3/4P2q/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
        "6k1/5ppp/8/8/8/8/5PPP/3R2K1 w - - 0 1",
    ]
    with open(os.path.join(d, "positions.fen"), "w") as f:
        f.write("\n".join(fens) + "\n")
    return ["positions.fen"]


GENERATORS = {
    "text": gen_text,
    "text24": gen_text24,
    "image": gen_image,
    "alignment": gen_alignment,
    "genome": gen_genome,
    "matrices": gen_matrices,
    "positions": gen_positions,
}


def ensure(work_dir, names):
    """Generates the inputs `names` in work_dir unless already there; returns nothing."""
    os.makedirs(work_dir, exist_ok=True)
    manifest_path = os.path.join(work_dir, "inputs.json")
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except (OSError, ValueError):
        manifest = {}
    for name in names:
        if name not in GENERATORS:
            raise SystemExit("unknown input '%s' (known: %s)" % (name, ", ".join(GENERATORS)))
        entry = manifest.get(name)
        if entry and entry.get("version") == VERSION and all(
                os.path.exists(os.path.join(work_dir, p))
                and os.path.getsize(os.path.join(work_dir, p)) == size
                for p, size in entry["files"].items()):
            continue
        print("gen_inputs: writing %s" % name, file=sys.stderr)
        files = GENERATORS[name](work_dir)
        manifest[name] = {"version": VERSION,
                          "files": {p: os.path.getsize(os.path.join(work_dir, p)) for p in files}}
        with open(manifest_path + ".tmp", "w") as f:
            json.dump(manifest, f, indent=1)
        os.replace(manifest_path + ".tmp", manifest_path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work_dir", required=True)
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    ensure(a.work_dir, a.names or list(GENERATORS))


if __name__ == "__main__":
    main()
