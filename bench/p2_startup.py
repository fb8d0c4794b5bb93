"""P2 start-up: cold wall time of `python -m distify --check FILE` vs `python -c "import libcst"`.

    python bench/p2_startup.py [--quick] [--json PATH]

FILE is a generated ~300-line training script (examples_style.in.py with its helpers duplicated).
"Cold" means a fresh interpreter per run (the OS page cache and .pyc files are warm, as they are for a
user running the command twice). Also checks with ``python -X importtime`` that the CLI never imports
torch, and lists its 10 slowest imports (cumulative, i.e. including what they import).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import FIXTURES, PY, clean_env, finish, goal, md_table, median, parse_args, spread, wall  # noqa: E402

TARGET_LINES = 300


def make_script(path: str) -> int:
    """Write a ~300-line training script; returns its line count."""
    import libcst as cst

    import corpus

    with open(os.path.join(FIXTURES, "scenarios", "examples_style.in.py"), encoding="utf-8") as f:
        module = cst.parse_module(f.read())
    helpers = [s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value != "main"]
    body = list(module.body)
    at = next(i for i, s in enumerate(body) if corpus._is_main_guard(s))
    out, k = module, 0
    while out.code.count("\n") < TARGET_LINES and k < 50:  # one helper copy at a time
        h = helpers[k % len(helpers)]
        body.insert(at, h.with_changes(name=cst.Name(f"{h.name.value}_copy{k}"),
                                       leading_lines=[cst.EmptyLine(), cst.EmptyLine()]))
        at += 1
        k += 1
        out = module.with_changes(body=body)
    code = out.code
    with open(path, "w", encoding="utf-8") as f:
        f.write(code)
    return code.count("\n")


def importtime(cmd, env) -> list:
    """(cumulative_us, self_us, depth, module) for each import of `cmd`, from -X importtime."""
    _, proc = wall([PY, "-X", "importtime"] + cmd, env=env, ok=(0, 1))
    rows = []
    for line in proc.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line or "self [us]" in line:
            continue
        _, self_us, cum_us, name = (x.strip() if i < 3 else x for i, x in enumerate(line.split("|", 0) and
                                    [line.split(":", 1)[0]] + line.split(":", 1)[1].split("|")))
        depth = (len(name) - len(name.lstrip(" "))) // 2
        rows.append((int(cum_us), int(self_us), depth, name.strip()))
    return rows


def main(argv=None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    repeats = 2 if args.quick else 9
    tmp = tempfile.mkdtemp(prefix="distify-bench-p2-")
    try:
        script = os.path.join(tmp, "train_300.py")
        lines = make_script(script)
        env = clean_env()
        cli_cmd = [PY, "-m", "distify", "--check", script]
        base_cmd = [PY, "-c", "import libcst"]
        bare_py = [PY, "-c", "pass"]
        # one unmeasured run of each: .pyc files written, page cache warm
        for c in (cli_cmd, base_cmd, bare_py):
            wall(c, env=env, ok=(0, 1))
        t = {"cli": [], "libcst": [], "python": []}
        for i in range(repeats):
            for k, c in ((("cli", cli_cmd), ("libcst", base_cmd), ("python", bare_py)) if i % 2 == 0 else
                         (("python", bare_py), ("libcst", base_cmd), ("cli", cli_cmd))):
                t[k].append(wall(c, env=env, ok=(0, 1))[0])
        med = {k: median(v) for k, v in t.items()}

        imports = importtime(["-m", "distify", "--check", script], env)
        torch_mods = sorted({m for _, _, _, m in imports if m == "torch" or m.startswith("torch.")})
        assert not torch_mods, f"the CLI imported torch: {torch_mods[:5]}"
        top = sorted(imports, reverse=True)[:10]
        top_rows = [[f"`{'  ' * d}{m}`", f"{c / 1000:.1f}", f"{s / 1000:.1f}"] for c, s, d, m in top]
        by_self = sorted(imports, key=lambda r: -r[1])[:10]
        self_rows = [[f"`{m}`", f"{s / 1000:.1f}"] for c, s, d, m in by_self]
        total_imports_ms = sum(s for _, s, _, _ in imports) / 1000

        rows = [
            [f"`python -m distify --check` {lines}-line script", f"{med['cli']:.3f}", spread(t["cli"]),
             f"{med['cli'] / med['libcst']:.2f}x"],
            ["`python -c \"import libcst\"`", f"{med['libcst']:.3f}", spread(t["libcst"]), "1.00x"],
            ["`python -c pass` (interpreter only)", f"{med['python']:.3f}", spread(t["python"]),
             f"{med['python'] / med['libcst']:.2f}x"],
        ]
        table = f"Median of {repeats} fresh processes each, interleaved.\n\n" + md_table(
            ["command", "median s", "min..max s", "vs import libcst"], rows)
        extra = (
            f"torch imported by the CLI: {'no' if not torch_mods else 'YES'} "
            f"(checked with `python -X importtime`; {len(imports)} modules, {total_imports_ms:.0f} ms of imports in all).\n\n"
            "Slowest imports of the CLI (cumulative ms = with everything they import):\n\n"
            + md_table(["module", "cumulative ms", "self ms"], top_rows)
            + "\n\nLargest self times:\n\n" + md_table(["module", "self ms"], self_rows)
        )
        goals = [
            goal("cli wall time", med["cli"], 0.45, False, " s"),
            goal("cli/import-libcst wall ratio", med["cli"] / med["libcst"], None, False, "x"),
        ]
        finish("P2", "start-up", table, goals, args, extra,
               data={"median_s": med, "runs": t, "lines": lines, "torch_imported": bool(torch_mods),
                     "top_imports": [(m, c, s) for c, s, d, m in top]})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
