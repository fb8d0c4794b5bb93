"""P5 scaling: samples/s of the distify-migrated workload vs a hand-written DDP version, 1 and 2 gloo
processes under ``torchrun --standalone``.

    python bench/p5_scaling.py [--quick] [--json PATH]

The workload is ``bench/workloads/mlp_train.py`` (single-process script) migrated by distify;
``bench/workloads/mlp_train_ddp_hand.py`` is the same script converted by hand. samples/s is the
global rate: dataset size / epoch time, the median over the epochs after the first (warm-up) one.
Every process runs with OMP_NUM_THREADS=1 (torchrun's own default for several processes). The plain
single-process original is measured too (no process group, no DDP), for reference.

Everything runs twice: with glibc's allocator as is, and controlled (``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` at 256 MiB, as in P4). With the defaults, a script whose gradients are freed
every step gives their memory back to the kernel and faults it in again, unless something long-lived
such as DDP's buckets keeps it in the heap. glibc raises its mmap and trim thresholds the first time
a large mmapped block is freed, and DDP's set-up frees one (its parameter broadcast); the original
script, and the migrated one at 1 process (no DDP there), do not. The run "original, one 4 MiB block
freed at start" shows it: that single allocation gives the plain script the same speed-up. So with the
allocator as is, the 1-process ratio measures glibc's heuristic, not the code; the goal is judged
with the allocator controlled, and the ratios as is are reported beside it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import (CONTROLLED_ALLOCATOR, PY, WORKLOADS, alternate, clean_env, epoch_times, finish, goal,  # noqa: E402
                     md_table, median, migrate_copy, parse_args, torchrun, wall)


def main(argv=None) -> None:
    args = parse_args(__doc__.splitlines()[0], argv)
    q = args.quick
    repeats = 1 if q else 3
    nprocs = [2] if q else [1, 2]
    work = ["--samples", "512", "--epochs", "2", "--width", "128"] if q else ["--samples", "4096", "--epochs", "4"]
    tmp = tempfile.mkdtemp(prefix="distify-bench-p5-")
    env = clean_env(OMP_NUM_THREADS="1")
    controlled = dict(env, **CONTROLLED_ALLOCATOR)
    modes = {"": env, " controlled": controlled}
    try:
        original = os.path.join(tmp, "mlp_train.py")
        shutil.copy(os.path.join(WORKLOADS, "mlp_train.py"), original)
        migrated = migrate_copy(original, os.path.join(tmp, "mlp_train_migrated.py"))
        hand = os.path.join(WORKLOADS, "mlp_train_ddp_hand.py")
        samples = int(work[1])
        warm = os.path.join(tmp, "mlp_train_warm.py")
        with open(original) as f:
            text = f.read()
        line = "import torch\n"
        assert line in text
        with open(warm, "w") as f:  # the original, plus what DDP's set-up does to glibc by the way
            f.write(text.replace(line, line + "_block = torch.empty(1 << 20)  # 4 MiB, freed at once\ndel _block\n", 1))

        def rate(cmd, run_env):
            def f():
                _, proc = wall(cmd, env=run_env, cwd=tmp)
                ts = epoch_times(proc.stdout)
                steady = ts[1:] or ts
                return samples / median(steady)
            return f

        funcs = {}
        for mode, run_env in modes.items():
            for n in nprocs:
                funcs[f"migrated {n}p{mode}"] = rate(torchrun(n) + [migrated, *work], run_env)
                funcs[f"hand {n}p{mode}"] = rate(torchrun(n) + [hand, *work], run_env)
            if not q:
                funcs[f"original 1p{mode}"] = rate([PY, original, *work], run_env)
        if not q:
            funcs["original 1p warm"] = rate([PY, warm, *work], env)
        r = alternate(funcs, repeats)
        med = {k: median(v) for k, v in r.items()}

        rows = []
        for mode in modes:
            for n in nprocs:
                m, h = med[f"migrated {n}p{mode}"], med[f"hand {n}p{mode}"]
                eff_m = f"{m / (n * med[f'migrated 1p{mode}']):.2f}" if 1 in nprocs else ""
                eff_h = f"{h / (n * med[f'hand 1p{mode}']):.2f}" if 1 in nprocs else ""
                orig = f"{med[f'original 1p{mode}']:.0f}" if not q and n == 1 else ""
                rows.append([mode.strip() or "as is", n, f"{m:.0f}", f"{h:.0f}", f"{m / h:.3f}", eff_m, eff_h, orig])
        table = (f"`{' '.join(work)}`; samples/s = median of {repeats} alternating runs, OMP_NUM_THREADS=1; "
                 "the original is the plain single-process script (no process group, no DDP).\n\n"
                 + md_table(["allocator", "processes", "migrated samples/s", "hand-written samples/s", "migrated/hand",
                             "scaling eff. migrated", "scaling eff. hand", "original samples/s"], rows))
        if not q:
            table += (f"\n\nOriginal, one 4 MiB block freed at start, allocator as is: "
                      f"{med['original 1p warm']:.0f} samples/s ({med['original 1p warm'] / med['original 1p']:.2f}x "
                      "the original).")
        goals = [goal(f"migrated/hand-written samples/s at {n} processes, allocator controlled",
                      med[f"migrated {n}p controlled"] / med[f"hand {n}p controlled"], 0.98, True, "x")
                 for n in nprocs]
        goals += [goal(f"migrated/hand-written samples/s at {n} processes, allocator as is",
                       med[f"migrated {n}p"] / med[f"hand {n}p"], None, True, "x") for n in nprocs]
        if 1 in nprocs:
            goals.append(goal("2-process speed-up (migrated)", med["migrated 2p"] / med["migrated 1p"], None, True, "x"))
        finish("P5", "scaling", table, goals, args, data={"samples_per_s": r, "median": med})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
