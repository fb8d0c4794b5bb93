"""``distify verify``: prove a migration by running it.

    distify verify train.py [--backend ddp|horovod|fsdp] [--select CODES] [--ignore CODES] [--steps N]
                            [--nproc 2] [--timeout S] [--as-is] [--standalone]
                            [--against-original --batch-arg NAME] [--json]
                            -- SCRIPT_ARGS...

It migrates a copy of the script (the user's file is never touched; ``--as-is`` takes the script
as it is), then runs the copy on CPU with gloo and CUDA hidden, with the user's own arguments and
data: once with plain ``python``, once with ``--nproc`` processes under the backend's launcher
(torchrun for ddp and fsdp, or Horovod's gloo launcher), and with ``--against-original`` the original script with its
batch argument multiplied by ``--nproc``. The probe in ``distify/_probe`` (a sitecustomize on the
children's PYTHONPATH) records what each rank does and stops every run after ``--steps``
optimizer steps; this module judges the records and prints a table of checks and a verdict.

Where the runs happen. Each run gets its own sandbox directory that mirrors the user's current
directory (or the script's directory when the script lies outside it): every entry there is a link
to the user's entry, except that the folders on the way to the script are real and the script is
the (migrated) copy, under its own name. The run's working directory is the mirror of the user's
current directory, so relative data paths, ``__file__``-relative paths and sibling imports resolve
as in the user's own run. Writes stay in the sandbox: the probe replaces a link by a private copy
(a folder by a real folder of links, a file by a copy) just before something writes through it, so
checkpoints, images and logs of the three runs never overwrite the user's files or each other.
Only what the script writes to absolute paths outside the sandbox (an ``--output-dir /data/runs``)
lands where the script says, as in a real run. The sandboxes and records live in one temporary
directory, removed at the end, on timeout and on Ctrl-C, after every process started is killed
(each run is a new session; its process groups are killed by id).

Under FSDP2 ranks hold different shards of each parameter: the probe gathers every DTensor
parameter whole (``full_tensor()``) before it digests or snapshots it, so "ranks identical after
each step" and ``--against-original`` compare the full weights; and since a sharded parameter is
identical on all ranks by construction, a separate check shows that each optimizer's parameters
are sharded and actually change (an optimizer built before fully_shard steps dead tensors).

Nothing here imports torch: the children do, and weights are compared by a child process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import typer

from distify import flags
from distify.options import FSDP_BACKEND, TORCH_BACKENDS, Options

PROBE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_probe")
EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
WEIGHTS_ATOL = 1e-4  # the migrated run vs the original at N x batch: float32 summation order only

# How a launcher tells a process it is one rank of many: a plain run must see none of them.
_LAUNCHER_PREFIXES = ("DISTIFY_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "PMIX_", "MV2_", "HOROVOD_", "MPI_LOCAL")
_LAUNCHER_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                   "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK"}

PASS, FAIL, SKIP = "pass", "fail", "skip"


@dataclass
class Check:
    name: str
    title: str
    status: str
    detail: str
    where: List[dict] = field(default_factory=list)  # {"path", "line", "source"}

    def as_json(self) -> dict:
        return {"name": self.name, "title": self.title, "status": self.status, "detail": self.detail, "where": self.where}


@dataclass
class Run:
    label: str
    argv: List[str]
    records: Path
    sandbox: Path
    returncode: Optional[int] = None
    timed_out: bool = False
    seconds: float = 0.0
    output: str = ""
    skipped: str = ""  # why it did not run

    @property
    def ok(self) -> bool:
        return not self.skipped and not self.timed_out and self.returncode == 0

    def events(self) -> Dict[int, List[dict]]:
        """rank -> its records, in order."""
        out: Dict[int, List[dict]] = {}
        for path in sorted(self.records.glob("rank*.jsonl")):
            rank = int(path.stem[4:])
            lines = path.read_text(errors="replace").splitlines()
            out[rank] = [json.loads(line) for line in lines if line.strip().startswith("{") and line.rstrip().endswith("}")]
        return out

    def as_json(self) -> dict:
        return {"label": self.label, "argv": self.argv, "returncode": self.returncode, "timed_out": self.timed_out,
                "seconds": round(self.seconds, 2), "skipped": self.skipped or None}


class VerifyError(Exception):
    """Bad input: exit 2 with this message."""


# --- the sandbox --------------------------------------------------------------------------------


def build_sandbox(run_dir: Path, script: Path, text: bytes, cwd: Path) -> Tuple[Path, Path]:
    """Mirror the user's tree into run_dir (see the module docstring); write `text` as the script.
    Returns (the script's path in the sandbox, the working directory for the run)."""
    script, cwd = script.resolve(), cwd.resolve()
    root = cwd if script.parent == cwd or cwd in script.parent.parents else script.parent
    chain = [root] + [p for p in reversed(script.parent.parents) if root in p.parents] + ([script.parent] if script.parent != root else [])
    for index, folder in enumerate(chain):
        mirror = run_dir / folder.relative_to(root)
        mirror.mkdir(parents=True, exist_ok=True)
        keep_real = chain[index + 1].name if index + 1 < len(chain) else None
        for entry in sorted(os.listdir(folder)):
            if entry == keep_real or (folder == script.parent and entry == script.name):
                continue
            os.symlink(folder / entry, mirror / entry)
    copy = run_dir / script.relative_to(root)
    copy.write_bytes(text)
    workdir = run_dir / cwd.relative_to(root) if root == cwd else copy.parent
    return copy, workdir


# --- processes ----------------------------------------------------------------------------------


def child_env(extra: Dict[str, str]) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_NAMES and not k.startswith(_LAUNCHER_PREFIXES)}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (PROBE_DIR, os.environ.get("PYTHONPATH", "")) if p)
    env.update(extra)
    return env


def _children_of() -> Dict[int, List[int]]:
    kids: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def kill_tree(pid: int) -> None:
    """Kill the process `pid` (a session leader we started), everything below it and their process
    groups, by id: SIGTERM, then SIGKILL for what is left after 3 s."""
    own = os.getpgrp()

    def targets() -> Tuple[List[int], set]:
        pids, todo = [], [pid]
        kids = _children_of() if os.path.isdir("/proc") else {}
        while todo:
            p = todo.pop()
            pids.append(p)
            todo += kids.get(p, [])
        groups = {pid}
        for p in pids:
            try:
                groups.add(os.getpgid(p))
            except OSError:
                pass
        groups.discard(own)
        return pids, groups

    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids, groups = targets()
        for g in groups:
            try:
                os.killpg(g, sig)
            except OSError:
                pass
        for p in pids:
            try:
                os.kill(p, sig)
            except OSError:
                pass
        if sig == signal.SIGTERM:
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline and any(_alive(p) for p in pids):
                time.sleep(0.1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def execute(run: Run, workdir: Path, env: Dict[str, str], timeout: float, log: Path) -> None:
    """Run `run.argv` in its own session; kill everything it started when it ends, times out or
    the user presses Ctrl-C (re-raised)."""
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(run.argv, cwd=str(workdir), env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            run.returncode = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            run.timed_out = True
        finally:
            kill_tree(proc.pid)
            if proc.returncode is None:
                proc.wait()
    run.seconds = time.monotonic() - start
    run.output = log.read_text(errors="replace")


# --- judging the records ------------------------------------------------------------------------


class Sources:
    """Source lines of the files the probe names (paths relative to a sandbox)."""

    def __init__(self, script_rel: str, script_text: str, root: Path):
        self.script_rel, self.lines, self.root = script_rel, script_text.splitlines(), root

    def where(self, site) -> Optional[dict]:
        if not site:
            return None
        rel, line = site
        if rel == self.script_rel:
            lines = self.lines
        else:
            try:
                lines = (self.root / rel).read_text(errors="replace").splitlines()
            except OSError:
                lines = []
        source = lines[line - 1].strip() if 0 < line <= len(lines) else ""
        return {"path": rel, "line": line, "source": source}


def _where(sources: Sources, *sites) -> List[dict]:
    out, seen = [], set()
    for site in sites:
        w = sources.where(site)
        if w and (w["path"], w["line"]) not in seen:
            seen.add((w["path"], w["line"]))
            out.append(w)
    return out


def check_run(name: str, title: str, run: Run, steps: int) -> Check:
    if run.skipped:
        return Check(name, title, SKIP, run.skipped)
    events = run.events()
    if run.timed_out:
        return Check(name, title, FAIL, f"timed out after {run.seconds:.0f} s (killed){_tail(run.output)}")
    stop_errors = [e for evs in events.values() for e in evs if e["k"] == "stop_error"]
    if stop_errors:
        return Check(name, title, FAIL, f"the ranks did not all reach step {steps} together: {stop_errors[0]['error']}")
    if run.returncode != 0:
        return Check(name, title, FAIL, f"exit status {run.returncode}{_tail(run.output)}")
    if not events:
        return Check(name, title, FAIL, "the probe saw no process running the script" + _tail(run.output))
    stopped = sum(1 for evs in events.values() if any(e["k"] == "stop" for e in evs))
    ranks = len(events)
    how = f"stopped after {steps} optimizer steps" if stopped == ranks else "ran to the end"
    return Check(name, title, PASS, f"{ranks} process{'es' if ranks > 1 else ''}, {how} ({run.seconds:.0f} s)")


def _tail(output: str, lines: int = 12) -> str:
    text = "\n".join(output.rstrip().splitlines()[-lines:])
    return "\n" + text if text else ""


def check_params(events: Dict[int, List[dict]], sources: Sources) -> Check:
    title = "ranks hold the same parameters after every step"
    steps: Dict[Tuple[int, int], Dict[int, dict]] = {}
    sites = {}
    for rank, evs in events.items():
        for e in evs:
            if e["k"] == "step":
                steps.setdefault((e["opt"], e["n"]), {})[rank] = e
            elif e["k"] == "opt":
                sites[e["id"]] = e["site"]
    if not steps:
        return Check("params", title, SKIP, "no optimizer stepped")
    ranks = sorted(events)
    for (opt, n), by_rank in sorted(steps.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        missing = [r for r in ranks if r not in by_rank]
        if missing:
            return Check("params", title, FAIL, f"optimizer {opt}: step {n} happened on ranks {sorted(by_rank)} but not on {missing}",
                         _where(sources, sites.get(opt)))
        digests = {e["sha"] for e in by_rank.values()}
        if len(digests) > 1:
            sums = ", ".join(f"rank {r}: sum|w| {by_rank[r]['abs']:.6g}" for r in ranks)
            return Check("params", title, FAIL,
                         f"after step {n} the ranks' parameters differ ({sums}): gradients are not averaged across "
                         "ranks (no DDP wrap / hvd.DistributedOptimizer) or the ranks did not start from rank 0's "
                         "weights (no broadcast; verify initialises ranks other than 0 differently on purpose)",
                         _where(sources, sites.get(opt)))
    n_opts = len({opt for opt, _ in steps})
    last = max(n for _, n in steps)
    sharded = max((e.get("sharded", 0) for by_rank in steps.values() for e in by_rank.values()), default=0)
    gathered = " (sharded parameters gathered whole before comparing)" if sharded else ""
    return Check("params", title, PASS, f"{n_opts} optimizer{'s' if n_opts > 1 else ''}, {len(ranks)} ranks bit-identical after each of {last} steps{gathered}",
                 _where(sources, *sites.values()))


def check_sharded_steps(events: Dict[int, List[dict]], sources: Sources) -> Check:
    """FSDP: every optimizer that steps holds sharded parameters (DTensors) and they change."""
    title = "optimizers step the sharded parameters"
    steps: Dict[int, List[dict]] = {}
    sites = {}
    for e in events.get(0, []):
        if e["k"] == "step":
            steps.setdefault(e["opt"], []).append(e)
        elif e["k"] == "opt":
            sites[e["id"]] = e["site"]
    if not steps:
        return Check("sharded", title, SKIP, "no optimizer stepped")
    for opt, evs in sorted(steps.items()):
        if not any(e.get("sharded") for e in evs):
            return Check("sharded", title, FAIL,
                         f"optimizer {opt} holds no sharded (DTensor) parameter: it was built before fully_shard (it "
                         "then updates tensors the model no longer uses) or its model is not sharded (its updates "
                         "are not averaged); build it after fully_shard(model)", _where(sources, sites.get(opt)))
        if len(evs) >= 2 and evs[0]["sha"] == evs[-1]["sha"]:
            return Check("sharded", title, FAIL,
                         f"optimizer {opt}'s parameters did not change from step {evs[0]['n']} to step {evs[-1]['n']}: "
                         "it updates nothing (built before fully_shard?)", _where(sources, sites.get(opt)))
    return Check("sharded", title, PASS, f"{len(steps)} optimizer{'s' if len(steps) > 1 else ''} over sharded parameters "
                                         "that change with each step", _where(sources, *sites.values()))


def _training_loaders(events: Dict[int, List[dict]]) -> Dict[int, dict]:
    """loader id -> its `loader` record, for loaders whose batches fed an optimizer step."""
    loaders, train = {}, set()
    for evs in events.values():
        for e in evs:
            if e["k"] == "loader":
                loaders.setdefault(e["id"], e)
            elif e["k"] == "train":
                train.add(e["loader"])
    return {lid: loaders[lid] for lid in sorted(train) if lid in loaders}


def _passes(events: Dict[int, List[dict]], lid: int) -> Dict[int, Dict[int, Tuple[List[int], bool]]]:
    """pass -> rank -> (indices in order, complete)."""
    out: Dict[int, Dict[int, Tuple[List[int], bool]]] = {}
    for rank, evs in events.items():
        for e in evs:
            if e["k"] == "batch" and e["loader"] == lid:
                idx, done = out.setdefault(e["p"], {}).setdefault(rank, ([], False))
                idx.extend(e["i"])
            elif e["k"] == "end" and e["loader"] == lid:
                idx, _ = out.setdefault(e["p"], {}).get(rank, ([], False))
                out[e["p"]][rank] = (idx, True)
    return out


def check_shards(events: Dict[int, List[dict]], sources: Sources) -> Check:
    title = "ranks read disjoint shards that cover the data"
    loaders = _training_loaders(events)
    if not loaders:
        return Check("shards", title, SKIP, "no DataLoader fed an optimizer step")
    ranks = sorted(events)
    nranks = len(ranks)
    notes = []
    unseen = [lid for lid in loaders if not any(idx for by in _passes(events, lid).values() for idx, _ in by.values())]
    if len(unseen) == len(loaders):
        return Check("shards", title, SKIP, "the training loader yields no sample indices to compare (an IterableDataset "
                                            "stream, or a sampler of non-integer keys)",
                     _where(sources, *(loaders[lid]["site"] for lid in unseen)))
    for lid, info in loaders.items():
        where = _where(sources, info["site"])
        for p, by_rank in sorted(_passes(events, lid).items()):
            seen = [i for r in ranks for i in by_rank.get(r, ([], False))[0]]
            unique = set(seen)
            repeated = len(seen) - len(unique)
            if repeated > nranks - 1:
                counts = {}
                for r in ranks:
                    for i in set(by_rank.get(r, ([], False))[0]):
                        counts[i] = counts.get(i, 0) + 1
                shared = sum(1 for c in counts.values() if c > 1)
                return Check("shards", title, FAIL,
                             f"pass {p}: {shared} samples were read by more than one rank ({len(seen)} reads of "
                             f"{len(unique)} samples): the training loader has no per-rank sampler", where)
            complete = len(by_rank) == nranks and all(done for _, done in by_rank.values())
            length = info.get("len")
            if complete and length:
                missing = length - len(unique & set(range(length)))
                allowed = (nranks - 1) + (nranks * (info["batch_size"] - 1) if info.get("drop_last") and info.get("batch_size") else 0)
                if missing > allowed:
                    return Check("shards", title, FAIL,
                                 f"pass {p}: the ranks together read {len(unique)} of {length} samples ({missing} never read)", where)
                notes.append(f"pass {p}: {' + '.join(str(len(by_rank[r][0])) for r in ranks)} of {length} samples, "
                             f"{repeated} padding")
            elif p == 0:
                notes.append(f"pass {p}: {' + '.join(str(len(by_rank.get(r, ([], 0))[0])) for r in ranks)} samples so far "
                             f"(of {length}), disjoint; the pass did not finish within the steps")
    return Check("shards", title, PASS, "; ".join(notes[:3]) or "disjoint", _where(sources, *(i["site"] for i in loaders.values())))


def check_order(events: Dict[int, List[dict]], sources: Sources, steps: int) -> Check:
    title = "a shuffled order changes between passes"
    loaders = _training_loaders(events)
    shuffled = {lid: info for lid, info in loaders.items() if info.get("shuffle")}
    if not loaders:
        return Check("order", title, SKIP, "no DataLoader fed an optimizer step")
    if not shuffled:
        return Check("order", title, SKIP, "the training loader does not shuffle")
    notes = []
    for lid, info in shuffled.items():
        passes = _passes(events, lid)
        where = _where(sources, info["site"])
        if 1 not in passes:
            per_pass = len(passes.get(0, {}).get(0, ([], 0))[0]) // max(1, info.get("batch_size") or 1)
            hint = f" (about {2 * per_pass + 1})" if passes.get(0, {}).get(0, ([], False))[1] else ""
            if not steps:
                return Check("order", title, SKIP, "the run made one pass over the training data: run 2 epochs or more", where)
            return Check("order", title, SKIP, f"fewer than 2 passes in {steps} steps: raise --steps{hint}", where)
        for rank in sorted(events):
            first = passes[0].get(rank, ([], False))[0]
            second = passes[1].get(rank, ([], False))[0]
            n = min(len(first), len(second))
            if n and first[:n] == second[:n]:
                return Check("order", title, FAIL,
                             f"rank {rank} read passes 0 and 1 in the same order: the DistributedSampler needs "
                             "set_epoch(epoch) at the start of every pass", where)
        at = f"{info['site'][0]}:{info['site'][1]}" if info["site"] else f"loader {lid}"
        notes.append(f"{at}: pass 1 differs from pass 0 on every rank")
    return Check("order", title, PASS, "; ".join(notes), _where(sources, *(i["site"] for i in shuffled.values())))


def _ignored_write(path: str, records_root: str) -> bool:
    """The probe's own records and Python's bytecode caches."""
    return path.endswith((".pyc", ".pyo")) or path.startswith(records_root) or "/__pycache__/" in path


def check_writers(run: Run, events: Dict[int, List[dict]], sources: Sources, records_root: str) -> Check:
    title = "one rank writes each file"
    writers: Dict[str, Dict[int, list]] = {}
    for rank, evs in events.items():
        for e in evs:
            if e["k"] == "write" and not _ignored_write(e["path"], records_root):
                writers.setdefault(e["path"], {}).setdefault(rank, []).append(e.get("site"))
    if not writers:
        return Check("writers", title, SKIP, "no file was written within the steps (writes after the last step are "
                                             "checked only when the run ends first: --steps 0 runs to the end)")
    sandbox = str(run.sandbox.resolve())
    shown = lambda p: os.path.relpath(p, sandbox) if p.startswith(sandbox + os.sep) else p  # noqa: E731
    shared = {p: by for p, by in writers.items() if len(by) > 1}
    if shared:
        path, by = sorted(shared.items())[0]
        sites = [s for r in sorted(by) if r != 0 for s in by[r]] + by.get(0, [])
        more = f" (and {len(shared) - 1} more)" if len(shared) > 1 else ""
        return Check("writers", title, FAIL, f"{shown(path)} was written by ranks {sorted(by)}{more}", _where(sources, *sites))
    # temporary files libraries made and removed outside the sandbox (gloo's, torch's) are judged, not listed
    listed = {p: by for p, by in writers.items() if p.startswith(sandbox + os.sep) or os.path.exists(p)}
    names = ", ".join(f"{shown(p)} (rank {next(iter(by))})" for p, by in sorted(listed.items())[:4])
    more = f" and {len(listed) - 4} more" if len(listed) > 4 else ""
    others = len(writers) - len(listed)
    if not listed:
        return Check("writers", title, SKIP, f"no file was written within the steps, only {others} temporary file"
                                             f"{'s' if others > 1 else ''} a library made and removed")
    more += f" (+{others} temporary file{'s' if others > 1 else ''} already removed)" if others else ""
    return Check("writers", title, PASS, f"{len(listed)} file{'s' if len(listed) != 1 else ''}: {names}{more}")


def check_prefix(runs: Sequence[Run], original: Optional[Run], sources: Sources) -> Check:
    title = "saved state has no wrapper prefix"
    saves = [(run, e) for run in runs if not run.skipped for evs in run.events().values() for e in evs
             if e["k"] == "write" and e.get("how") == "torch.save" and "prefixed" in e]
    if not saves:
        return Check("prefix", title, SKIP, "nothing was saved with torch.save within the steps")
    original_prefixed = set()
    if original is not None and not original.skipped:
        root = str(original.sandbox.resolve())
        for evs in original.events().values():
            for e in evs:
                if e["k"] == "write" and e.get("prefixed"):
                    original_prefixed.add(os.path.relpath(e["path"], root))
    bad = [(run, e) for run, e in saves if e["prefixed"] and os.path.relpath(e["path"], str(run.sandbox.resolve())) not in original_prefixed]
    if bad:
        run, e = bad[0]
        return Check("prefix", title, FAIL, f"{os.path.relpath(e['path'], str(run.sandbox.resolve()))} holds a state_dict whose keys "
                                            "start with 'module.' (save the unwrapped model: model.module)", _where(sources, e.get("site")))
    return Check("prefix", title, PASS, f"{len({e['path'] for _, e in saves})} torch.save target(s), no 'module.' prefix")


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def check_prints(events: Dict[int, List[dict]], sources: Sources) -> Check:
    title = "log lines are printed once"
    printed: Dict[str, Dict[int, list]] = {}
    total = 0
    for rank, evs in events.items():
        for e in evs:
            if e["k"] == "out" and e["text"].strip():
                total += 1
                key = _NUMBER.sub("#", e["text"].strip())
                printed.setdefault(key, {}).setdefault(rank, []).append(e.get("site"))
    if not printed:
        return Check("prints", title, SKIP, "nothing was printed to stdout")
    twice = {k: by for k, by in printed.items() if len(by) > 1}
    if twice:
        line, by = next(iter(twice.items()))
        sites = [s for r in sorted(by) if r != 0 for s in by[r][:1]]
        return Check("prints", title, FAIL, f"{len(twice)} line(s) printed by ranks {sorted(by)}, e.g. {line[:80]!r}", _where(sources, *sites))
    return Check("prints", title, PASS, f"{total} line{'s' if total != 1 else ''} on stdout, each from one rank")


def check_random(events: Dict[int, List[dict]], sources: Sources) -> Optional[Check]:
    """Batches drawn without a sampler (torch.randint/randperm in the training loop): do the ranks
    draw different ones? None when the script draws none."""
    title = "ranks draw different random batches"
    draws: Dict[tuple, Dict[int, List[str]]] = {}
    windows: Dict[tuple, set] = {}
    for rank, evs in events.items():
        for e in evs:
            if e["k"] == "rand" and e.get("site"):
                key = tuple(e["site"])
                draws.setdefault(key, {}).setdefault(rank, []).append(e["sha"])
                windows.setdefault(key, set()).add(e["w"])
    loop_sites = [k for k, w in windows.items() if len(w) >= 2]
    if not loop_sites:
        return None
    same = []
    for key in loop_sites:
        by = draws[key]
        if len(by) > 1 and len({tuple(v) for v in by.values()}) == 1:
            same.append(key)
    if same:
        return Check("random", title, FAIL, f"every rank drew the same indices at each step: the draw needs a per-rank "
                                            "generator or seed", _where(sources, *same))
    return Check("random", title, PASS, f"{len(loop_sites)} draw site(s) in the training loop differ between ranks",
                 _where(sources, *loop_sites))


def compare_weights(a: Path, b: Path) -> dict:
    """Max |difference| between two probe snapshots, computed by a child process (no torch here)."""
    code = ("import json, sys, torch\n"
            "a = torch.load(sys.argv[1]); b = torch.load(sys.argv[2])\n"
            "if sorted(a) != sorted(b) or any(len(a[k]) != len(b[k]) for k in a): print(json.dumps({'error': 'different optimizers or parameters'})); sys.exit()\n"
            "d = max([float((x.double() - y.double()).abs().max()) if x.shape == y.shape else float('inf') for k in a for x, y in zip(a[k], b[k])] or [0.0])\n"
            "print(json.dumps({'max_abs_diff': d}))\n")
    env = child_env({})
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code, str(a), str(b)], capture_output=True, text=True, env=env, timeout=300)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": (out.stderr or out.stdout).strip()[-500:]}


def check_weights(multi: Run, original: Run, nproc: int, batch_note: str, shuffled: bool) -> Check:
    title = f"weights equal the original's at {nproc} x batch"
    if original.skipped or multi.skipped:
        return Check("weights", title, SKIP, original.skipped or multi.skipped)
    if not original.ok:
        return Check("weights", title, FAIL, f"the original script failed at {batch_note}: exit status {original.returncode}"
                                             f"{' (timed out)' if original.timed_out else ''}{_tail(original.output)}")
    a, b = multi.records / "params.rank0.pt", original.records / "params.rank0.pt"
    if not a.exists() or not b.exists():
        return Check("weights", title, SKIP, "a run ended before the step limit, so there is no snapshot to compare "
                                             "(lower --steps)")
    result = compare_weights(a, b)
    if "error" in result:
        return Check("weights", title, FAIL, f"cannot compare: {result['error']}")
    diff = result["max_abs_diff"]
    if shuffled:
        return Check("weights", title, SKIP, f"max |difference| {diff:.3g}, not judged: the training loader shuffles "
                                             "(the orders differ); compare with shuffling off")
    status = PASS if diff <= WEIGHTS_ATOL else FAIL
    return Check("weights", title, status, f"max |difference| {diff:.3g} after the same steps (tolerance {WEIGHTS_ATOL:g}; "
                                           f"original run at {batch_note})")


# --- the command --------------------------------------------------------------------------------


@dataclass
class Plan:
    script: Path
    script_args: List[str]
    backend: str
    steps: int
    nproc: int
    timeout: float
    as_is: bool
    standalone: bool
    against_original: bool
    batch_arg: Optional[str]
    options: Optional[Options] = None  # what the copy is migrated with: flags and [tool.distify], as `distify` would


def scale_batch(args: List[str], name: str, factor: int) -> Tuple[List[str], Optional[str], str]:
    """(args with NAME's value multiplied, the argparse dest to scale in the child if NAME is not in
    args, a note). Accepts NAME as 'batch-size', '--batch-size' or 'batch_size'."""
    bare = name.lstrip("-")
    flags = {"--" + bare, "--" + bare.replace("_", "-"), "--" + bare.replace("-", "_")}
    out = list(args)
    for i, arg in enumerate(out):
        key, eq, value = arg.partition("=")
        if key in flags:
            if eq:
                target, raw = i, value
            elif i + 1 < len(out):
                target, raw = i + 1, out[i + 1]
            else:
                raise VerifyError(f"{key} has no value in the script's arguments")
            try:
                scaled = str(int(raw) * factor)
            except ValueError:
                raise VerifyError(f"{key} {raw!r} is not an integer batch size") from None
            out[target] = f"{key}={scaled}" if eq else scaled
            return out, None, f"{key} {scaled}"
    return out, bare.replace("-", "_"), f"{factor} x the default of --{bare}"


def _horovod_missing() -> Optional[str]:
    probe = subprocess.run([sys.executable, "-c", "import horovod.torch"], capture_output=True, text=True,
                           env=child_env({"PYTHONPATH": os.environ.get("PYTHONPATH", "")}), timeout=120)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["import failed"])[-1]
        return f"Horovod runs skipped: horovod.torch is not importable ({last}); install Horovod built with PyTorch and gloo to check this backend"
    return None


def verify(plan: Plan) -> dict:
    """Migrate, run, judge. Returns the report (see render); raises VerifyError for bad input and
    KeyboardInterrupt when interrupted (after cleaning up)."""
    if not plan.script.is_file():
        raise VerifyError(f"{plan.script}: no such file")
    source = plan.script.read_bytes()
    checks: List[Check] = []
    findings = []
    if plan.as_is:
        migrated = source
        checks.append(Check("migrate", "the script to check", PASS, "as it is (--as-is)"))
    else:
        from distify.engine import InputError, migrate_source
        from distify.options import Options

        try:
            result = migrate_source(source, plan.options or Options(backend=plan.backend, standalone=plan.standalone))
        except InputError as e:
            raise VerifyError(f"{plan.script}: {e}") from None
        migrated = result.output
        findings = [f.format(str(plan.script)) for f in result.findings if f.kind == "warning"]
        if not result.changed:
            why = result.note or "nothing to change"
            checks.append(Check("migrate", "distify migrates a copy", FAIL,
                                f"distify left the script unchanged ({why}); use --as-is to check a script that is "
                                "already distributed" + "".join("\n" + w for w in findings)))
            return _report(plan, checks, [], findings)
        fixes = sum(1 for f in result.findings if f.kind != "warning")
        checks.append(Check("migrate", "distify migrates a copy", PASS,
                            f"{fixes} change{'s' if fixes != 1 else ''}, {len(findings)} warning{'s' if len(findings) != 1 else ''}"
                            f"{' (--standalone)' if plan.standalone else ''}; your file is untouched"))

    tmp = Path(tempfile.mkdtemp(prefix="distify-verify-")).resolve()
    runs: List[Run] = []
    try:
        runs = _run_all(plan, tmp, migrated)
        plain, multi = runs[0], runs[1]
        original = runs[2] if len(runs) > 2 else None
        rel = str(plan.script.resolve().relative_to(_root(plan.script)))
        sources = Sources(rel, migrated.decode("utf-8", errors="replace"), _root(plan.script))
        launcher = "torchrun" if plan.backend in TORCH_BACKENDS else "horovodrun --gloo"
        checks.append(check_run("plain", "runs with plain python", plain, plan.steps))
        checks.append(check_run("launch", f"runs under {launcher} with {plan.nproc} processes", multi, plan.steps))
        if not multi.skipped:
            events = multi.events()
            checks += [check_params(events, sources), check_shards(events, sources),
                       check_order(events, sources, plan.steps), check_writers(multi, events, sources, str(tmp / "records")),
                       check_prefix([plain, multi], original, sources), check_prints(events, sources)]
            if plan.backend == FSDP_BACKEND:
                checks.append(check_sharded_steps(events, sources))
            random_check = check_random(events, sources)
            if random_check is not None:
                checks.append(random_check)
        if original is not None:
            shuffled = any(info.get("shuffle") for info in _training_loaders(multi.events()).values()) if not multi.skipped else False
            checks.append(check_weights(multi, original, plan.nproc, original.label.split(": ", 1)[-1], shuffled))
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return _report(plan, checks, runs, findings)


def _root(script: Path) -> Path:
    script, cwd = script.resolve(), Path.cwd().resolve()
    return cwd if script.parent == cwd or cwd in script.parent.parents else script.parent


def _run_all(plan: Plan, tmp: Path, migrated: bytes) -> List[Run]:
    py = sys.executable
    n = str(plan.nproc)
    cwd = Path.cwd()
    horovod_skip = _horovod_missing() if plan.backend == "horovod" else None
    # the Horovod script imports horovod in every run, the plain one too
    specs = [("plain python", migrated, lambda s, a: [py, s, *a], plan.script_args, horovod_skip)]
    if plan.backend in TORCH_BACKENDS:
        multi = lambda s, a: [py, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", n, s, *a]  # noqa: E731
    else:
        multi = lambda s, a: [py, "-m", "horovod.runner.launch", "--gloo", "-np", n, "-H", f"localhost:{n}", py, s, *a]  # noqa: E731
    specs.append((f"{plan.nproc} processes", migrated, multi, plan.script_args, horovod_skip))
    if plan.against_original:
        args, dest, note = scale_batch(plan.script_args, plan.batch_arg, plan.nproc)
        specs.append((f"original: {note}", plan.script.read_bytes(), lambda s, a: [py, s, *a], args, horovod_skip, dest))
    runs = []
    for index, spec in enumerate(specs):
        label, text, argv_of, args, skip = spec[:5]
        dest = spec[5] if len(spec) > 5 else None
        run_dir = tmp / f"run{index}"
        records = tmp / "records" / str(index)
        records.mkdir(parents=True)
        run_dir.mkdir()
        copy, workdir = build_sandbox(run_dir, plan.script, text, cwd)
        run = Run(label, argv_of(str(copy), list(args)), records, run_dir)
        runs.append(run)
        if skip:
            run.skipped = skip
            continue
        child_tmp = tmp / "tmp" / str(index)  # the launchers' and libraries' temporary files go with ours
        child_tmp.mkdir(parents=True)
        env = child_env({"DISTIFY_VERIFY_SCRIPT": str(copy), "DISTIFY_VERIFY_RECORDS": str(records),
                         "DISTIFY_VERIFY_SANDBOX": str(run_dir), "DISTIFY_VERIFY_STEPS": str(plan.steps or 10**12),
                         "TMPDIR": str(child_tmp)})
        if dest:
            env["DISTIFY_VERIFY_SCALE"] = f"{dest}:{plan.nproc}"
        if plan.backend == FSDP_BACKEND:
            # fully_shard keeps each rank's own slice of its own initial weights (no broadcast): the
            # FSDP script relies on ranks initialising alike, which the probe would otherwise undo
            env["DISTIFY_VERIFY_DIVERGE"] = "0"
        execute(run, workdir, env, plan.timeout, tmp / f"output{index}.log")
        if dest and not any(e["k"] == "scaled" for evs in run.events().values() for e in evs) and run.ok:
            run.returncode, run.output = -1, f"--{dest.replace('_', '-')} is neither in the script's arguments nor an argparse option of the script"
    return runs


def _report(plan: Plan, checks: List[Check], runs: List[Run], findings: List[str]) -> dict:
    failed = [c for c in checks if c.status == FAIL]
    multi_skipped = any(r.skipped for r in runs[1:2])
    verdict = FAIL if failed or multi_skipped or len(runs) < 2 else PASS
    return {"script": str(plan.script), "backend": plan.backend, "nproc": plan.nproc, "steps": plan.steps,
            "as_is": plan.as_is, "verdict": verdict, "checks": [c.as_json() for c in checks],
            "runs": [r.as_json() for r in runs], "warnings": findings}


_MARK = {PASS: "PASS", FAIL: "FAIL", SKIP: "skip"}
_STYLE = {PASS: "green", FAIL: "bold red", SKIP: "yellow"}


def _verdict_line(report: dict) -> str:
    checks = report["checks"]
    failed = [c["title"] for c in checks if c["status"] == FAIL]
    if failed:
        return f"verdict: FAILED - {len(failed)} check{'s' if len(failed) > 1 else ''} failed: {'; '.join(failed)}"
    if report["verdict"] == FAIL:
        why = next((c["detail"] for c in checks if c["name"] == "launch" and c["status"] == SKIP), "")
        return "verdict: NOT VERIFIED - the multi-process run did not happen" + (f" ({why})" if why else "")
    held = sum(1 for c in checks if c["status"] == PASS)
    return f"verdict: OK - {held} check{'s hold' if held != 1 else ' holds'} ({sum(1 for c in checks if c['status'] == SKIP)} not applicable)"


def _where_lines(check: dict) -> List[str]:
    return [f"{w['path']}:{w['line']}: {w['source']}" for w in check["where"]]


def render_text(report: dict) -> str:
    mode = "as it is" if report["as_is"] else f"migrated for {report['backend']}"
    lines = [f"distify verify {report['script']} ({mode}, {report['nproc']} processes, "
             f"{report['steps'] or 'all'} steps)"]
    for c in report["checks"]:
        detail = c["detail"].splitlines() or [""]
        lines.append(f"  {_MARK[c['status']]:<4}  {c['title']}: {detail[0]}")
        lines += [f"          {d}" for d in detail[1:]]
        if c["status"] == FAIL:
            lines += [f"          at {w}" for w in _where_lines(c)]
    lines.append(_verdict_line(report))
    return "\n".join(lines) + "\n"


def render_rich(report: dict, console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    mode = "as it is" if report["as_is"] else f"migrated for {report['backend']}"
    table = Table(title=f"distify verify {escape(report['script'])} ({mode}, {report['nproc']} processes, "
                        f"{report['steps'] or 'all'} steps)", show_lines=False)
    table.add_column("", no_wrap=True)
    table.add_column("check")
    table.add_column("evidence")
    for c in report["checks"]:
        evidence = escape(c["detail"])
        if c["status"] == FAIL and c["where"]:
            evidence += "".join(f"\n[dim]at {escape(w)}[/dim]" for w in _where_lines(c))
        table.add_row(f"[{_STYLE[c['status']]}]{_MARK[c['status']]}[/]", escape(c["title"]), evidence)
    console = console or Console()
    console.print(table)
    style = "bold green" if report["verdict"] == PASS else "bold red"
    console.print(f"[{style}]{escape(_verdict_line(report))}[/]")


app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False, context_settings={"help_option_names": ["-h", "--help"]})


@app.command(help="Prove a migration by running it: migrate a copy of SCRIPT, run it with plain python and "
                  "with --nproc processes on CPU, and check what each rank did. Arguments after '--' go to the script.")
def verify_command(
    paths: List[str] = typer.Argument(..., metavar="SCRIPT", hidden=True),
    backend: Optional[str] = flags.backend("ddp"),
    select: Optional[List[str]] = flags.select(),
    ignore: Optional[List[str]] = flags.ignore(),
    steps: int = typer.Option(20, "--steps", metavar="N", min=0, help="Stop each run after this many optimizer steps (0: run to the end)."),
    nproc: int = typer.Option(2, "--nproc", metavar="N", min=2, help="Processes of the multi-process run."),
    timeout: float = typer.Option(600.0, "--timeout", metavar="SECONDS", min=1.0, help="Seconds each run may take before everything it started is killed."),
    as_is: bool = typer.Option(False, "--as-is", help="Check the script as it is (already distributed): no migration."),
    standalone: Optional[bool] = typer.Option(None, "--standalone", help="Migrate with --standalone (runtime helpers written into the script)."),
    against_original: bool = typer.Option(False, "--against-original", help="Also run the original with the batch argument x nproc and compare the weights."),
    batch_arg: Optional[str] = typer.Option(None, "--batch-arg", metavar="NAME", help="The script's batch-size option for --against-original (e.g. --batch-size)."),
    as_json: bool = flags.as_json(),
) -> None:
    from distify import config
    from distify.runner import UsageError, migration_options

    try:  # the copy is migrated as `distify` would migrate the script: same flags, same [tool.distify]
        options = migration_options(config.load(paths[:1]), backend, select, ignore, standalone=standalone)
    except (config.ConfigError, UsageError) as e:
        _usage(str(e))
    if against_original and not batch_arg:
        _usage("--against-original needs --batch-arg NAME (the script's batch-size option)")
    plan = Plan(Path(paths[0]), list(paths[1:]), options.backend, steps, nproc, timeout, as_is, options.standalone,
                against_original, batch_arg, options)
    try:
        report = verify(plan)
    except VerifyError as e:
        _usage(str(e))
    except KeyboardInterrupt:
        sys.stderr.write("distify verify: interrupted; every process it started was killed and its files removed\n")
        raise typer.Exit(EXIT_INTERRUPTED)
    if as_json:
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    elif sys.stdout.isatty():
        render_rich(report)
    else:
        sys.stdout.write(render_text(report))
    raise typer.Exit(EXIT_OK if report["verdict"] == PASS else EXIT_FAILED)


def _usage(message: str) -> None:
    sys.stderr.write(f"distify verify: error: {message}\n")
    raise typer.Exit(EXIT_INPUT)


def main(argv: Sequence[str]) -> int:
    """``distify verify ARGV...``; returns the exit status."""
    try:
        code = app(args=list(argv), prog_name="distify verify", standalone_mode=False)
    except typer.Exit as e:
        return e.exit_code
    except SystemExit as e:  # click's usage errors
        return e.code if isinstance(e.code, int) else EXIT_INPUT
    except Exception as e:  # noqa: BLE001 - click's UsageError and friends (typer may carry its own click)
        if callable(getattr(e, "show", None)) and isinstance(getattr(e, "exit_code", None), int):
            e.show()
            return EXIT_INPUT
        sys.stderr.write(f"distify verify: internal error: {type(e).__name__}: {e}\n")
        return 123
    return code if isinstance(code, int) else EXIT_OK
