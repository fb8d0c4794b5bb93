"""Run every benchmark and rewrite bench/RESULTS.md.

    python bench/run_all.py [--quick] [--only P1,P4] [--output PATH]

Each benchmark runs as its own process (``bench/pN_*.py --json``). RESULTS.md gets the machine it ran
on, a goal summary and each benchmark's tables; ``bench/results.json`` holds the raw numbers (``--only``
re-runs some benchmarks and keeps the stored results of the others). The written readings are kept across runs: text
between ``<!-- keep:PN -->`` and ``<!-- /keep:PN -->`` (and ``<!-- keep:notes -->``) in the existing
file is carried over into the new one.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BENCH, PY, clean_env, goal_line, machine, md_table  # noqa: E402

SCRIPTS = [
    ("P1", "p1_throughput.py"),
    ("P2", "p2_startup.py"),
    ("P3", "p3_comm.py"),
    ("P4", "p4_overhead.py"),
    ("P5", "p5_scaling.py"),
    ("P6", "p6_cache.py"),
    ("P7", "p7_engine.py"),
]
KEEP = re.compile(r"<!-- keep:(\w+) -->\n(.*?)<!-- /keep:\1 -->", re.S)


def kept(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            return {m.group(1): m.group(2) for m in KEEP.finditer(f.read())}
    except OSError:
        return {}


def keep_block(key: str, blocks: dict, default: str) -> str:
    return f"<!-- keep:{key} -->\n{blocks.get(key, default)}<!-- /keep:{key} -->"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="", help="comma-separated keys, e.g. P1,P3 (the others' stored results are kept)")
    ap.add_argument("--output", default=os.path.join(BENCH, "RESULTS.md"))
    a = ap.parse_args()
    only = {k.strip().upper() for k in a.only.split(",") if k.strip()}
    blocks = kept(a.output)
    info = machine()
    results, failures, durations = {}, {}, {}
    store = os.path.join(os.path.dirname(a.output), "results.json")
    if only and os.path.exists(store):  # a partial run updates the stored results of the others
        with open(store) as f:
            old = json.load(f)
        results.update({k: v for k, v in old.get("results", {}).items() if k not in only})
        durations.update({k: v for k, v in old.get("durations", {}).items() if k not in only})
    with tempfile.TemporaryDirectory(prefix="distify-bench-") as tmp:
        for key, script in SCRIPTS:
            if only and key not in only:
                continue
            out = os.path.join(tmp, f"{key}.json")
            cmd = [PY, os.path.join(BENCH, script), "--json", out] + (["--quick"] if a.quick else [])
            print(f"== {key}: {' '.join(cmd[1:])}", flush=True)
            t = time.perf_counter()
            proc = subprocess.run(cmd, env=clean_env(), text=True, capture_output=True)
            durations[key] = time.perf_counter() - t
            sys.stdout.write(proc.stdout)
            if proc.returncode != 0 or not os.path.exists(out):
                failures[key] = (proc.stderr or proc.stdout)[-3000:]
                sys.stderr.write(failures[key])
                continue
            with open(out) as f:
                results[key] = json.load(f)

    lines = [
        "# distify benchmarks: results",
        "",
        f"Written by `python bench/run_all.py{' --quick' if a.quick else ''}` on {info['date']}.",
        "",
        md_table(["machine", ""], [
            ["CPU", info["cpu"]], ["cores", info["cores"]], ["load average at the end (1/5/15 min)", info["loadavg"]],
            ["Python", info["python"]], ["torch", info["torch"]], ["libcst", info["libcst"]],
            ["platform", info["platform"]],
        ]),
        "",
        keep_block("notes", blocks, "(notes on the machine and on reading the numbers)\n"),
        "",
        "## Goals",
        "",
    ]
    rows = []
    for key, _ in SCRIPTS:
        for g in results.get(key, {}).get("goals", []):
            status = "info" if g["met"] is None else ("met" if g["met"] else "**missed**")
            target = "" if g["target"] is None else f"{g['op']} {g['target']}{g['unit']}"
            rows.append([key, g["name"], f"{g['value']:.3f}{g['unit']}", target, status])
        if key in failures:
            rows.append([key, "(benchmark failed)", "", "", "**failed**"])
    lines += [md_table(["", "measure", "value", "goal", ""], rows), ""]
    for key, script in SCRIPTS:
        if key not in results and key not in failures:
            continue
        r = results.get(key)
        title = r["title"] if r else "(failed)"
        lines += [f"## {key} {title}", "", f"`python bench/{script}` ({durations[key]:.0f} s)", ""]
        if r:
            lines += [r["table"], ""]
            if r["extra"]:
                lines += [r["extra"], ""]
            lines += ["```"] + [goal_line(g) for g in r["goals"]] + ["```", ""]
        else:
            lines += ["```", failures[key].strip(), "```", ""]
        lines += ["### Reading", "", keep_block(key, blocks, "(to be written)\n"), ""]
    with open(a.output, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    with open(store, "w") as f:
        json.dump({"machine": info, "results": results, "durations": durations}, f, indent=1)
    print(f"wrote {a.output}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
