"""P5 scaling: samples/s of the distify-migrated workload vs a hand-written DDP version, 1 and 2 gloo
processes under ``torchrun --standalone``.

    python bench/p5_scaling.py [--quick] [--json PATH]

The workload is ``bench/workloads/mlp_train.py`` (single-process script) migrated by distify;
``bench/workloads/mlp_train_ddp_hand.py`` is the same script converted by hand. samples/s is the
global rate: dataset size / epoch time, the median over the epochs after the first (warm-up) one.
Every process runs with OMP_NUM_THREADS=1 (torchrun's own default for several processes). The plain
single-process original is measured too (no process group, no DDP), for reference.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (PY, WORKLOADS, alternate, clean_env, epoch_times, finish, goal, md_table, median,  # noqa: E402
                     migrate_copy, parse_args, torchrun, wall)


def main(argv=None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    q = args.quick
    repeats = 1 if q else 3
    nprocs = [2] if q else [1, 2]
    work = ["--samples", "512", "--epochs", "2", "--width", "128"] if q else ["--samples", "4096", "--epochs", "4"]
    tmp = tempfile.mkdtemp(prefix="distify-bench-p5-")
    env = clean_env(OMP_NUM_THREADS="1")
    try:
        original = os.path.join(tmp, "mlp_train.py")
        shutil.copy(os.path.join(WORKLOADS, "mlp_train.py"), original)
        migrated = migrate_copy(original, os.path.join(tmp, "mlp_train_migrated.py"))
        hand = os.path.join(WORKLOADS, "mlp_train_ddp_hand.py")
        samples = int(work[1])

        def rate(cmd):
            def f():
                _, proc = wall(cmd, env=env, cwd=tmp)
                ts = epoch_times(proc.stdout)
                steady = ts[1:] or ts
                return samples / median(steady)
            return f

        funcs = {}
        for n in nprocs:
            funcs[f"migrated {n}p"] = rate(torchrun(n) + [migrated, *work])
            funcs[f"hand {n}p"] = rate(torchrun(n) + [hand, *work])
        if not q:
            funcs["original 1p (plain python)"] = rate([PY, original, *work])
        r = alternate(funcs, repeats)
        med = {k: median(v) for k, v in r.items()}

        rows = []
        for n in nprocs:
            m, h = med[f"migrated {n}p"], med[f"hand {n}p"]
            eff_m = f"{m / (n * med['migrated 1p']):.2f}" if 1 in nprocs else ""
            eff_h = f"{h / (n * med['hand 1p']):.2f}" if 1 in nprocs else ""
            rows.append([n, f"{m:.0f}", f"{h:.0f}", f"{m / h:.3f}", eff_m, eff_h])
        table = (f"`{' '.join(work)}`; samples/s = median of {repeats} alternating runs, OMP_NUM_THREADS=1.\n\n"
                 + md_table(["processes", "migrated samples/s", "hand-written samples/s", "migrated/hand",
                             "scaling eff. migrated", "scaling eff. hand"], rows))
        if not q:
            table += f"\n\nPlain single-process original (no DDP): {med['original 1p (plain python)']:.0f} samples/s."
        goals = [goal(f"migrated/hand-written samples/s at {n} processes", med[f"migrated {n}p"] / med[f"hand {n}p"],
                      0.98, True, "x") for n in nprocs]
        if 1 in nprocs:
            goals.append(goal("2-process speed-up (migrated)", med["migrated 2p"] / med["migrated 1p"], None, True, "x"))
        finish("P5", "scaling", table, goals, args, data={"samples_per_s": r, "median": med})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
