"""The corpus of programs not written for Stretch (corpus.json), as the tools that run it need
it: which programs, built and with their inputs in place, their command lines, how their output
is compared, and which of their processes are running. Used by tools/corpus and tools/soak.
"""
import hashlib
import json
import os
import re
import shutil
import subprocess

import gen_inputs

CORPUS_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(CORPUS_DIR))


class Error(Exception):
    """A corpus that cannot be run as asked (unknown program, failed build, missing binary)."""


def load(only=""):
    """The programs of corpus.json, or only those named in the comma-separated `only`."""
    with open(os.path.join(CORPUS_DIR, "corpus.json")) as f:
        programs = json.load(f)["programs"]
    if not only:
        return programs
    wanted = only.split(",")
    unknown = [w for w in wanted if w not in {p["name"] for p in programs}]
    if unknown:
        raise Error("unknown program(s) %s; known: %s"
                    % (", ".join(unknown), ", ".join(p["name"] for p in programs)))
    return [p for p in programs if p["name"] in wanted]


def _bazel(output_base, *args):
    cmd = ["bazel"] + (["--output_base=" + output_base] if output_base else []) + list(args)
    p = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise Error("%s failed:\n%s" % (" ".join(cmd), p.stderr[-4000:]))
    return p.stdout.strip()


def build(output_base="", stretchd=None):
    """Builds the corpus's own programs (and //:stretchd unless a `stretchd` binary is given)
    with -c opt. Returns (stretchd, dirs), dirs being what {workloads} and {corpus} in
    corpus.json's command lines stand for."""
    targets = ["//experiments/workloads:all", "//experiments/corpus:dgemm"]
    if not stretchd:
        targets.append("//:stretchd")
    _bazel(output_base, "build", "-c", "opt", *targets)
    bin_dir = _bazel(output_base, "info", "-c", "opt", "bazel-bin")
    stretchd = os.path.abspath(stretchd) if stretchd else os.path.join(bin_dir, "stretchd",
                                                                          "stretchd")
    if not os.access(stretchd, os.X_OK):
        raise Error("no stretchd at " + stretchd)
    dirs = {"workloads": os.path.join(bin_dir, "experiments", "workloads"),
            "corpus": os.path.join(bin_dir, "experiments", "corpus")}
    return stretchd, dirs


def prepare(work_dir, programs, log):
    """Writes the programs' inputs into work_dir (once) and runs their `prepare` commands there
    unless what they create exists."""
    gen_inputs.ensure(work_dir, sorted({i for p in programs for i in p.get("inputs", [])}))
    for p in programs:
        prep = p.get("prepare")
        if prep and not os.path.exists(os.path.join(work_dir, prep["creates"])):
            log("preparing %s: %s" % (p["name"], prep["sh"]))
            tmp = prep["creates"] + ".tmp"
            subprocess.run(prep["sh"].replace("> " + prep["creates"], "> " + tmp), shell=True,
                           cwd=work_dir, check=True)
            os.replace(os.path.join(work_dir, tmp), os.path.join(work_dir, prep["creates"]))


def command(prog, dirs):
    """(argv with an absolute program path, environment) of a corpus program."""
    argv = [a.format(**dirs) for a in prog["argv"]]
    exe = argv[0] if os.path.sep in argv[0] else shutil.which(argv[0])
    if exe is None or not os.access(exe, os.X_OK):
        raise Error("%s not found (tools/setup installs the corpus's packages)" % argv[0])
    env = dict(os.environ)
    env.update(prog.get("env", {}))
    return [os.path.abspath(exe)] + argv[1:], env


def digest(path, compare):
    """What is compared of an output file: a hash of all of it, or of the kept matches."""
    h = hashlib.md5()
    if isinstance(compare, dict):
        keep = re.compile(compare["keep"])
        with open(path, "rb") as f:
            for line in f.read().decode("utf-8", "replace").splitlines():
                m = keep.search(line)
                if m:
                    h.update(m.group(0).encode() + b"\n")
    else:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def pids_running(exe):
    """The processes whose executable is exe (a program's replicas are restored outside
    stretchd's process group, so they are found this way)."""
    pids = set()
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.readlink("/proc/%s/exe" % d) == exe:
                    pids.add(int(d))
            except OSError:
                pass
    return pids


def netns_of(pid):
    """The network namespaces of the emulated nodes of the stretchd with this pid."""
    try:
        return {n for n in os.listdir("/run/netns") if n.startswith("stretch-%d-" % pid)}
    except OSError:
        return set()
