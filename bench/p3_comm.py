"""P3 communication: gradient all-reduces and bytes per optimizer step of a migrated script, 2 gloo
processes under ``torchrun --standalone``.

    python bench/p3_comm.py [--quick] [--json PATH]

The workload is ``bench/workloads/mlp_train.py`` migrated by distify, run under ``bench/_p3_probe.py``
(a DDP comm hook counts bucket all-reduces and their bytes; a global optimizer hook counts steps;
explicit ``torch.distributed`` collectives are counted too). Measured without gradient accumulation
and with ``--accum 4``; the accumulation case is also migrated with ``--ignore DST402`` (no
``model.no_sync()``) to show what the rule saves.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import BENCH, WORKLOADS, clean_env, finish, goal, md_table, migrate_copy, parse_args, torchrun, wall  # noqa: E402


def main(argv=None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    q = args.quick
    work = ["--samples", "512", "--epochs", "1", "--width", "128"] if q else ["--samples", "2048", "--epochs", "1"]
    tmp = tempfile.mkdtemp(prefix="distify-bench-p3-")
    env = clean_env(OMP_NUM_THREADS="1")
    try:
        original = os.path.join(tmp, "mlp_train.py")
        shutil.copy(os.path.join(WORKLOADS, "mlp_train.py"), original)
        migrated = migrate_copy(original, os.path.join(tmp, "migrated.py"))
        naive = migrate_copy(original, os.path.join(tmp, "migrated_no_dst402.py"), "--ignore", "DST402")
        cases = [("migrated", migrated, 2)] if q else [
            ("migrated", migrated, 1), ("migrated", migrated, 4), ("migrated --ignore DST402", naive, 4)]
        rows, data, goals, callers = [], {}, [], {}
        for label, script, accum in cases:
            prefix = os.path.join(tmp, f"counts_{len(data)}")
            wall(torchrun(2) + [os.path.join(BENCH, "_p3_probe.py"), prefix, script, *work, "--accum", str(accum)],
                 env=env, cwd=tmp)
            ranks = [json.load(open(p)) for p in sorted(glob.glob(prefix + ".rank*.json"))]
            c = ranks[0]["counts"]
            steps = c.get("optimizer_steps", 0)
            calls = c.get("ddp_allreduce_calls", 0)
            nbytes = c.get("ddp_allreduce_bytes", 0)
            pbytes = ranks[0]["param_bytes"][0] if ranks[0]["param_bytes"] else 0
            explicit = {k: v for k, v in c.items() if k.startswith("explicit_")}
            per_step_calls = calls / steps if steps else float("nan")
            per_step_bytes = nbytes / steps if steps else float("nan")
            rows.append([label, accum, len(ranks), steps, calls, f"{per_step_calls:.2f}",
                         f"{per_step_bytes / 1e6:.2f}", f"{pbytes / 1e6:.2f}", f"{per_step_bytes / pbytes:.2f}x",
                         ", ".join(f"{k[9:]}={v}" for k, v in sorted(explicit.items())) or "none"])
            data[f"{label} accum={accum}"] = {"counts": c, "param_bytes": pbytes, "callers": ranks[0].get("callers", {})}
            callers.update(ranks[0].get("callers", {}))
            ideal = 1.0
            if label == "migrated":
                goals.append(goal(f"gradient bytes per optimizer step / model bytes (accum {accum})",
                                  per_step_bytes / pbytes, ideal, False, "x"))
        table = (f"`{' '.join(work)}`, 2 gloo processes, counts of rank 0.\n\n"
                 + md_table(["script", "accum", "ranks", "optimizer steps", "DDP all-reduce calls",
                             "all-reduces / step", "MB / step", "model grad MB", "bytes/step ÷ model",
                             "explicit collectives"], rows))
        extra = ("Explicit collectives called from Python (rank 0, where from):\n\n"
                 + ("\n".join(f"- `{k}`" for k in sorted(callers)) or "- none"))
        finish("P3", "communication", table, goals, args, extra, data=data)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
