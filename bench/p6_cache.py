"""P6 start-up and cache: a cold `distify --check` on one ~100-line script, and a second run over 20 files.

    python bench/p6_cache.py [--quick] [--json PATH]

The scripts are distify's own output for corpus variants (bench/corpus.py), i.e. already-migrated
files, the case pre-commit meets on every commit: `--check` exits 0 on each.

* one file of about 100 lines, `python -m distify --check FILE` with an empty cache folder per run
  (cold: everything imported, the file parsed, its entry written) vs `python -c "import libcst"`;
  also the same command once the cache holds the file (warm), for information;
* 20 such files, `python -m distify --check DIR`: the first run on an empty cache folder vs the
  second run right after it on the same folder (every file cached).

Every run is a fresh interpreter; variants are interleaved. ``python -X importtime`` shows where the
cold run's time goes and that the warm run imports neither libcst nor the rules (nor torch).
"""

from __future__ import annotations

import os
import resource
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import PY, clean_env, finish, goal, md_table, median, parse_args, spread, wall  # noqa: E402
from p2_startup import importtime  # noqa: E402

FILES = 20
TARGET_LINES = 100


def migrated_corpus(outdir: str, count: int) -> list:
    """`count` already-migrated scripts (distify's output, which distify leaves unchanged)."""
    import corpus
    from distify.engine import migrate_source
    from distify.options import Options

    raw = os.path.join(outdir, "raw")
    done = os.path.join(outdir, "migrated")
    os.makedirs(done)
    out = []
    for path in corpus.build(raw, count=4 * count):
        with open(path, "rb") as f:
            result = migrate_source(f.read(), Options())
        if not result.changed or migrate_source(result.output, Options()).changed:
            continue  # no training script, or not a fixed point: not what this measures
        dst = os.path.join(done, os.path.basename(path))
        with open(dst, "wb") as f:
            f.write(result.output)
        out.append(dst)
        if len(out) == count:
            break
    shutil.rmtree(raw)
    return out


def main(argv=None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    repeats = 1 if args.quick else 11
    tmp = tempfile.mkdtemp(prefix="distify-bench-p6-")
    try:
        files = migrated_corpus(tmp, FILES)
        assert len(files) == FILES, f"only {len(files)} migrated corpus files"
        lines = {f: sum(1 for _ in open(f, encoding="utf-8")) for f in files}
        one = min(files, key=lambda f: (abs(lines[f] - TARGET_LINES), f))
        single = os.path.join(tmp, "single")
        os.makedirs(single)
        one = shutil.copy(one, single)
        folder = os.path.dirname(files[0])
        env = clean_env()
        n = [0]

        def fresh_cache() -> dict:
            n[0] += 1
            return dict(env, DISTIFY_CACHE_DIR=os.path.join(tmp, f"cache{n[0]}"))

        warm_env = dict(env, DISTIFY_CACHE_DIR=os.path.join(tmp, "cache-warm"))
        one_cmd = [PY, "-m", "distify", "--check", one]
        dir_cmd = [PY, "-m", "distify", "--check", folder]
        base_cmd = [PY, "-c", "import libcst"]
        bare_cmd = [PY, "-c", "pass"]
        # unmeasured: .pyc files written, page cache warm, the warm cache filled
        for c, e in ((one_cmd, warm_env), (dir_cmd, fresh_cache()), (base_cmd, env), (bare_cmd, env)):
            wall(c, env=e)

        t = {"cold1": [], "warm1": [], "libcst": [], "python": [], "first20": [], "second20": []}
        cpu = {"cold1": [], "libcst": []}  # user+sys seconds of the same processes: a shared machine's
        # load stretches wall time far more than the CPU time a process itself spends

        def timed(key, cmd, e):
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t[key].append(wall(cmd, env=e)[0])
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu[key].append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)

        def pair20():
            e = fresh_cache()
            t["first20"].append(wall(dir_cmd, env=e)[0])
            t["second20"].append(wall(dir_cmd, env=e)[0])

        steps = [
            lambda: timed("cold1", one_cmd, fresh_cache()),
            lambda: timed("libcst", base_cmd, env),
            lambda: t["warm1"].append(wall(one_cmd, env=warm_env)[0]),
            lambda: t["python"].append(wall(bare_cmd, env=env)[0]),
            pair20,
        ]
        for i in range(repeats):
            for step in (steps if i % 2 == 0 else steps[::-1]):
                step()
        med = {k: median(v) for k, v in t.items()}
        pair_ratios = [b / a for a, b in zip(t["first20"], t["second20"])]
        round_ratios = [a / b for a, b in zip(t["cold1"], t["libcst"])]  # same round, next to each other
        cpu_ratios = [a / b for a, b in zip(cpu["cold1"], cpu["libcst"])]

        cold_imports = importtime(["-m", "distify", "--check", one], fresh_cache())
        e = fresh_cache()
        wall(dir_cmd, env=e)
        warm_imports = importtime(["-m", "distify", "--check", folder], e)
        heavy = sorted({m for _, _, _, m in warm_imports
                        if m.split(".")[0] in ("libcst", "torch", "typer", "pydantic", "rich")
                        or m.startswith(("distify.rules", "distify.anatomy"))})
        torch_mods = sorted({m for _, _, _, m in cold_imports if m.split(".")[0] == "torch"})
        assert not torch_mods, f"the CLI imported torch: {torch_mods[:5]}"
        by_top = {}
        for cum, _self, depth, m in cold_imports:
            if depth == 0:
                by_top[m] = by_top.get(m, 0) + cum
        top_rows = [[f"`{m}`", f"{c / 1000:.1f}"] for m, c in sorted(by_top.items(), key=lambda x: -x[1])[:8]]
        cold_import_ms = sum(s for _, s, _, _ in cold_imports) / 1000
        warm_import_ms = sum(s for _, s, _, _ in warm_imports) / 1000

        r = lambda k: f"{med[k] / med['libcst']:.2f}x"  # noqa: E731
        rows = [
            [f"`distify --check` one {lines_of(one)}-line migrated script, empty cache (cold)", f"{med['cold1']:.3f}",
             spread(t["cold1"]), r("cold1")],
            ["`python -c \"import libcst\"`", f"{med['libcst']:.3f}", spread(t["libcst"]), "1.00x"],
            ["`distify --check` the same script, cached (warm)", f"{med['warm1']:.3f}", spread(t["warm1"]), r("warm1")],
            ["`python -c pass` (interpreter only)", f"{med['python']:.3f}", spread(t["python"]), r("python")],
        ]
        rows20 = [
            [f"first `distify --check DIR`, {FILES} migrated files, empty cache", f"{med['first20']:.3f}",
             spread(t["first20"]), "1.00x"],
            ["second run, same files, same cache", f"{med['second20']:.3f}", spread(t["second20"]),
             f"{med['second20'] / med['first20']:.2f}x"],
        ]
        table = (
            f"Median of {repeats} fresh processes each, interleaved; every cold run gets its own empty cache folder.\n\n"
            + md_table(["command", "median s", "min..max s", "vs import libcst"], rows)
            + f"\n\nPer round, cold/import libcst: {min(round_ratios):.2f}..{max(round_ratios):.2f}x "
            f"(median {median(round_ratios):.2f}x). CPU time (user+sys) of the same processes: cold "
            f"{median(cpu['cold1']):.3f} s, import libcst {median(cpu['libcst']):.3f} s, per round "
            f"{min(cpu_ratios):.2f}..{max(cpu_ratios):.2f}x (median {median(cpu_ratios):.2f}x); load average "
            f"{os.getloadavg()[0]:.1f} at the end."
            + f"\n\n{FILES} files of {min(lines.values())}..{max(lines.values())} lines, "
            f"{sum(lines.values())} in all; {repeats} pairs (first, then second run on the same new cache folder).\n\n"
            + md_table(["command", "median s", "min..max s", "vs first run"], rows20)
            + f"\n\nPer pair, second/first: {min(pair_ratios):.2f}..{max(pair_ratios):.2f}x."
        )
        extra = (
            f"Cold one-file run (`python -X importtime`): {len(cold_imports)} modules, {cold_import_ms:.0f} ms of imports "
            f"in all; torch imported: {'no' if not torch_mods else 'YES'}. Top-level imports by cumulative ms:\n\n"
            + md_table(["module", "cumulative ms"], top_rows)
            + f"\n\nWarm {FILES}-file run: {len(warm_imports)} modules, {warm_import_ms:.0f} ms of imports; "
            f"libcst, the rules, typer, pydantic, rich or torch imported: {', '.join(heavy) if heavy else 'none'}."
        )
        goals = [
            # issue 24's acceptance: at most 1.2x
            goal("cold --check of one ~100-line script / import libcst", med["cold1"] / med["libcst"], 1.2, False, "x"),
            goal("cold --check of one script / import libcst, CPU time, median per round", median(cpu_ratios), None,
                 False, "x"),
            goal(f"second/first --check over {FILES} unchanged files", med["second20"] / med["first20"], 0.3, False, "x"),
            goal("warm --check of one script / import libcst", med["warm1"] / med["libcst"], None, False, "x"),
        ]
        finish("P6", "start-up and cache", table, goals, args, extra,
               data={"median_s": med, "runs": t, "cpu_s": cpu, "lines": lines_of(one), "files": FILES,
                     "warm_heavy_imports": heavy, "torch_imported": bool(torch_mods)})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def lines_of(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


if __name__ == "__main__":
    main()
