"""P1 migration throughput: `distify DIR --check` vs a bare libcst parse/render round trip.

    python bench/p1_throughput.py [--quick] [--json PATH]

Builds a deterministic corpus (bench/corpus.py, >= 200 variants of fixtures/**/*.in.py) in a temp dir
and measures, on the same files:

* the real CLI as users run it: ``python -m distify DIR --check -q --no-cache`` (whole-run wall time:
  interpreter start, imports, its process pool, every file parsed: the cache is P6's subject);
* ``libcst.parse_module(src).code`` sequentially in this process (the bare baseline), the same as a
  fresh process (interpreter start + ``import libcst`` included, like the CLI), and parallelised over
  the cores with a multiprocessing pool;
* ``distify.engine.migrate_source`` sequentially in this process (the engine without CLI start-up).

Then cProfiles the in-process ``migrate_source`` loop and lists the top 15 cumulative hotspots.
"""

from __future__ import annotations

import cProfile
import io
import multiprocessing
import os
import pstats
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import PY, ROOT, clean_env, finish, goal, md_table, median, parse_args, spread, wall  # noqa: E402

BARE_SNIPPET = (
    "import sys, libcst\n"
    "for p in sys.argv[1:]:\n"
    "    src = open(p, 'rb').read()\n"
    "    assert libcst.parse_module(src).bytes == src\n"
)


def _bare_one(path: str) -> int:
    import libcst

    with open(path, "rb") as f:
        src = f.read()
    out = libcst.parse_module(src).bytes
    assert out == src
    return len(out)


def bare_sequential(paths) -> float:
    t = time.perf_counter()
    for p in paths:
        _bare_one(p)
    return time.perf_counter() - t


def bare_parallel(paths, workers: int) -> float:
    t = time.perf_counter()
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(workers) as pool:
        pool.map(_bare_one, paths, chunksize=4)
    return time.perf_counter() - t


def engine_sequential(paths, options) -> float:
    from distify.engine import migrate_source

    t = time.perf_counter()
    for p in paths:
        with open(p, "rb") as f:
            migrate_source(f.read(), options)
    return time.perf_counter() - t


def profile_engine(paths, options, top: int = 15) -> str:
    from distify.engine import migrate_source

    sources = []
    for p in paths:
        with open(p, "rb") as f:
            sources.append(f.read())
    prof = cProfile.Profile()
    prof.enable()
    for s in sources:
        migrate_source(s, options)
    prof.disable()
    return _top(prof, top, None) + "\n\nOnly distify's own functions (migrate/, rules/):\n\n" + _top(prof, top, r"/(migrate|rules)/")


def _top(prof, top: int, restrict) -> str:
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("cumulative")
    if restrict:
        st.print_stats(restrict, top)
    else:
        st.print_stats(top + 8)  # a few rows are the profiler's own frames
    text = buf.getvalue()
    # keep the header line and the table, trim absolute paths to something readable
    lines = [ln for ln in text.splitlines() if ln.strip()]
    start = next(i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls"))
    rows = [ln for ln in lines[start + 1:] if "{method 'disable'" not in ln and "cProfile" not in ln]
    total = next((ln.strip() for ln in lines if "function calls" in ln), "")
    out = ([total, ""] if not restrict else []) + [lines[start]] + rows[:top]
    site = os.path.dirname(os.path.dirname(__import__("libcst").__file__))
    return "\n".join(ln.replace(ROOT + "/", "").replace(site + "/", "") for ln in out)


def main(argv=None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    import corpus
    from distify.rules.base import Options

    repeats = 1 if args.quick else 3
    tmp = tempfile.mkdtemp(prefix="distify-bench-p1-")
    try:
        paths = corpus.build(tmp, count=12 if args.quick else 240, max_inputs=6 if args.quick else 0)
        n = len(paths)
        nbytes = sum(os.path.getsize(p) for p in paths)
        nlines = sum(open(p, "rb").read().count(b"\n") for p in paths)
        cores = os.cpu_count() or 1
        options = Options(backend="ddp")
        env = clean_env()

        # warm the page cache and the .pyc files once, unmeasured
        wall([PY, "-m", "distify", tmp, "--check", "-q", "--no-cache"], env=env, ok=(0, 1))
        bare_sequential(paths)

        def cli() -> float:
            return wall([PY, "-m", "distify", tmp, "--check", "-q", "--no-cache"], env=env, ok=(0, 1))[0]

        def bare_proc() -> float:
            return wall([PY, "-c", BARE_SNIPPET] + paths, env=env)[0]

        times = {"cli": [], "bare_seq": [], "bare_proc": [], "bare_par": [], "engine": []}
        for i in range(repeats):  # interleaved so machine noise hits all variants alike
            times["cli"].append(cli())
            times["bare_seq"].append(bare_sequential(paths))
            times["bare_proc"].append(bare_proc())
            times["bare_par"].append(bare_parallel(paths, cores))
            times["engine"].append(engine_sequential(paths, options))
        med = {k: median(v) for k, v in times.items()}
        rate = {k: n / v for k, v in med.items()}

        labels = [
            ("cli", f"`python -m distify DIR --check -q --no-cache` (whole run, pool of {cores})"),
            ("bare_seq", "bare `parse_module(src)` + render, sequential, in-process"),
            ("bare_proc", "bare round trip, sequential, fresh process (start + import libcst incl.)"),
            ("bare_par", f"bare round trip, multiprocessing pool of {cores} (pool start incl.)"),
            ("engine", "`distify.engine.migrate_source`, sequential, in-process"),
        ]
        rows = [[label, f"{med[k]:.3f}", spread(times[k]), f"{rate[k]:.1f}", f"{rate[k] / rate['bare_seq']:.2f}x"]
                for k, label in labels]
        table = (f"Corpus: {n} files, {nlines} lines, {nbytes / 1024:.0f} KiB; median of {repeats} runs.\n\n"
                 + md_table(["what", "median s", "min..max s", "files/s", "vs bare sequential"], rows))
        prof = profile_engine(paths, options)
        extra = ("Top 15 cumulative hotspots, cProfile of in-process `migrate_source` over the corpus "
                 f"(profiler overhead inflates absolute times):\n\n```\n{prof}\n```")
        goals = [
            goal("cli/bare_sequential files/s", rate["cli"] / rate["bare_seq"], 0.5, True, "x"),
        ]
        info = {
            "cli/bare_parallel": rate["cli"] / rate["bare_par"],
            "cli/bare_process": rate["cli"] / rate["bare_proc"],
            "engine/bare_sequential": rate["engine"] / rate["bare_seq"],
        }
        extra = "\n".join(f"- {k} files/s ratio: {v:.2f}x" for k, v in info.items()) + "\n\n" + extra
        finish("P1", "migration throughput", table, goals, args, extra,
               data={"files": n, "median_s": med, "files_per_s": rate, "runs": times, **info})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
