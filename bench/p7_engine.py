"""P7 engine throughput in process: distify's per-file migration vs a bare libcst parse+render.

    python bench/p7_engine.py [--quick] [--json PATH] [--dir DIR]

Over the same training scripts (by default the 20 largest of ``fixtures/realscripts`` and
``fixtures/corpus``, the real-script idioms the rule fixtures do not hold; ``--dir`` takes every
``*.py`` of a folder instead), this process times:

* (a) ``libcst.parse_module(src).code``, the bare round trip every libcst codemod pays;
* (b) ``distify.engine.migrate_source(src, Options(backend="ddp"), path)``, what the CLI calls per
  file: decode, parse, facts, rules, edits, render, compile check and the audit of the output.

Both are warmed once (imports, first-use caches), then timed interleaved A B B A ..., medians of the
whole-corpus times. No interpreter start: that is P2's and P6's subject. A cProfile of (b) counts
the libcst parses per file (counts do not depend on the machine's load) and lists the hotspots.
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import io
import os
import pstats
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import FIXTURES, ROOT, alternate, finish, goal, md_table, median, spread  # noqa: E402

FILES = 20


def scripts(folder=None, count=FILES):
    if folder:
        return sorted(glob.glob(os.path.join(folder, "**", "*.py"), recursive=True))
    pool = [p for sub in ("realscripts", "corpus") for p in glob.glob(os.path.join(FIXTURES, sub, "*.in.py"))]
    return sorted(sorted(pool, key=lambda p: (-os.path.getsize(p), p))[:count])


def bare(sources) -> float:
    import libcst

    t = time.perf_counter()
    for _, src in sources:
        libcst.parse_module(src).code
    return time.perf_counter() - t


def engine(sources, options) -> float:
    from distify.engine import migrate_source

    t = time.perf_counter()
    for path, src in sources:
        migrate_source(src, options, path)
    return time.perf_counter() - t


def profile(sources, options, top: int = 20):
    """(libcst parses per file, cProfile table of the engine's own hotspots)."""
    import libcst

    from distify.engine import migrate_source

    prof = cProfile.Profile()
    prof.enable()
    for path, src in sources:
        migrate_source(src, options, path)
    prof.disable()
    st = pstats.Stats(prof)
    parses = sum(v[1] for k, v in st.stats.items() if k[2] == "parse_module" and "libcst" in k[0])
    parses += sum(v[1] for k, v in st.stats.items() if k[2] in ("parse_statement", "parse_expression") and "libcst" in k[0])
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(top)
    lines = [ln for ln in buf.getvalue().splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    total = next((ln.strip() for ln in lines if "function calls" in ln), "")
    site = os.path.dirname(os.path.dirname(libcst.__file__))
    table = "\n".join([total, ""] + lines[start:start + 1 + top])
    return parses / len(sources), table.replace(ROOT + "/", "").replace(site + "/", "")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes and few repeats (smoke test)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON (used by run_all.py)")
    p.add_argument("--dir", help="time every *.py under this folder instead of the fixtures' scripts")
    p.add_argument("--repeats", type=int, default=0, help="timed rounds per variant (default 10, --quick 1)")
    args = p.parse_args(argv)
    from distify.options import Options

    paths = scripts(args.dir, 3 if args.quick else FILES)
    sources = []
    for path in paths:
        with open(path, "rb") as f:
            sources.append((path, f.read()))
    options = Options(backend="ddp")
    repeats = args.repeats or (1 if args.quick else 10)
    bare(sources), engine(sources, options)  # warm: imports, first-use caches
    times = alternate({"bare": lambda: bare(sources), "engine": lambda: engine(sources, options)}, repeats)
    med = {k: median(v) for k, v in times.items()}
    ratio = med["bare"] / med["engine"]
    nlines = sum(src.count(b"\n") for _, src in sources)
    rows = [
        ["bare `libcst.parse_module(src).code`", f"{med['bare']:.3f}", spread(times["bare"]), "1.00x"],
        ["`distify.engine.migrate_source` (rules, render, audit)", f"{med['engine']:.3f}", spread(times["engine"]),
         f"{ratio:.2f}x"],
    ]
    table = (f"{len(sources)} scripts, {nlines} lines; whole-corpus time, median of {repeats} interleaved rounds.\n\n"
             + md_table(["what", "median s", "min..max s", "speed vs bare"], rows))
    per_file, prof = profile(sources, options)
    extra = (f"libcst parses (module, statement, expression) per file in the engine: {per_file:.1f}\n\n"
             f"cProfile of the engine over the same files, by own time (the profiler inflates times):\n\n```\n{prof}\n```")
    finish("P7", "engine throughput in process", table,
           [goal("engine/bare parse+render speed", ratio, 0.5, True, "x")], args, extra,
           data={"files": len(sources), "median_s": med, "runs": times, "parses_per_file": per_file})


if __name__ == "__main__":
    main()
