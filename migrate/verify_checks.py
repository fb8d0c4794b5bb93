"""The checks of ``distify verify``: each judges what the probe recorded and says one of

- ``held``: the run exercised it and it held;
- ``failed``: the run exercised it and it did not hold (the line involved is named);
- ``not_exercised``: it applies to this script, but the runs did not reach what it is about (a save the
  run never got to, one pass where two are needed); ``prove`` says what would exercise it;
- ``not_applicable``: it cannot apply to this script (the training loader does not shuffle, the script
  writes no file), with the fact that says so.

The verdict (``distify.verify``) is OK only when no check failed and none was left unexercised. Nothing
here imports torch.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from distify.verify_facts import ScriptFacts, Site

HELD, FAILED, NOT_EXERCISED, NOT_APPLICABLE = "held", "failed", "not_exercised", "not_applicable"
WEIGHTS_ATOL = 1e-4  # the migrated run vs the original at N x batch: float32 summation order only


@dataclass
class Check:
    name: str
    title: str
    status: str
    detail: str
    where: List[dict] = field(default_factory=list)  # {"path", "line", "source"}
    prove: str = ""  # not_exercised: what would exercise it

    def as_json(self) -> dict:
        return {"name": self.name, "title": self.title, "status": self.status, "detail": self.detail,
                "prove": self.prove or None, "where": self.where}


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
    _events: Optional[Dict[int, List[dict]]] = None

    @property
    def ok(self) -> bool:
        return not self.skipped and not self.timed_out and self.returncode == 0

    def events(self) -> Dict[int, List[dict]]:
        """rank -> its records, in order."""
        if self._events is None:
            out: Dict[int, List[dict]] = {}
            for path in sorted(self.records.glob("rank*.jsonl")):
                lines = path.read_text(errors="replace").splitlines()
                out[int(path.stem[4:])] = [json.loads(line) for line in lines
                                           if line.strip().startswith("{") and line.rstrip().endswith("}")]
            self._events = out
        return self._events

    def stop(self) -> Optional[dict]:
        """The probe's `stop` record when it ended the run early (rank 0's), else None."""
        return next((e for evs in self.events().values() for e in evs if e["k"] == "stop"), None)

    def as_json(self) -> dict:
        return {"label": self.label, "argv": self.argv, "returncode": self.returncode, "timed_out": self.timed_out,
                "seconds": round(self.seconds, 2), "skipped": self.skipped or None}


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


def _tail(output: str, lines: int = 12) -> str:
    text = "\n".join(output.rstrip().splitlines()[-lines:])
    return "\n" + text if text else ""


# --- how far the runs got -----------------------------------------------------------------------

_STOPPED = {
    "loop": ("verify stopped the run {n} steps in: its training loop does not end when its data passes do (it "
             "is not a for loop over a DataLoader), so the code after the loop never ran",
             "run with --steps 0 and script arguments that make the whole run short (fewer iterations)"),
    "cap": ("verify stopped the run {n} steps in: the script went on through more than 100 cut-short passes, so the "
            "code after its training never ran", "pass fewer epochs, or run with --steps 0"),
}


@dataclass(frozen=True)
class Reach:
    """Whether the multi-process run got to the end of the script (what runs after training ran)."""
    end: bool
    why: str = ""
    prove: str = ""


def reach_of(run: Run) -> Reach:
    if run.skipped:
        return Reach(False, f"the multi-process run did not happen ({run.skipped})", "install what it needs")
    if not run.ok:
        return Reach(False, "the multi-process run failed before its end", "fix the run (see its check)")
    stop = run.stop()
    if stop is not None and stop.get("reason") in _STOPPED:
        why, prove = _STOPPED[stop["reason"]]
        return Reach(False, why.format(n=stop.get("steps")), prove)
    return Reach(True)


def check_run(name: str, title: str, run: Run, steps: int) -> Check:
    if run.skipped:
        return Check(name, title, NOT_EXERCISED, run.skipped, prove="install Horovod built with PyTorch and gloo")
    events = run.events()
    if run.timed_out:
        return Check(name, title, FAILED, f"timed out after {run.seconds:.0f} s (killed){_tail(run.output)}")
    stop_errors = [e for evs in events.values() for e in evs if e["k"] == "stop_error"]
    if stop_errors:
        return Check(name, title, FAILED, f"the ranks did not all reach the same step together: {stop_errors[0]['error']}")
    if run.returncode != 0:
        return Check(name, title, FAILED, f"exit status {run.returncode}{_tail(run.output)}")
    if not events:
        return Check(name, title, FAILED, "the probe saw no process running the script" + _tail(run.output))
    ranks = len(events)
    stop = run.stop()
    drained = any(e["k"] == "drain" for evs in events.values() for e in evs)
    if stop is not None:
        how = f"stopped after {stop.get('steps')} optimizer steps"
    elif drained:
        how = f"ran to the end, its data passes cut short after {steps} optimizer steps"
    else:
        how = "ran to the end"
    return Check(name, title, HELD, f"{ranks} process{'es' if ranks > 1 else ''}, {how} ({run.seconds:.0f} s)")


# --- parameters ---------------------------------------------------------------------------------

_TRAIN_PROVE = "run with script arguments that train (at least one optimizer step)"


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
        return Check("params", title, NOT_EXERCISED, "no optimizer stepped", prove=_TRAIN_PROVE)
    ranks = sorted(events)
    for (opt, n), by_rank in sorted(steps.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        missing = [r for r in ranks if r not in by_rank]
        if missing:
            return Check("params", title, FAILED, f"optimizer {opt}: step {n} happened on ranks {sorted(by_rank)} but not on {missing}",
                         _where(sources, sites.get(opt)))
        if len({e["sha"] for e in by_rank.values()}) > 1:
            sums = ", ".join(f"rank {r}: sum|w| {by_rank[r]['abs']:.6g}" for r in ranks)
            return Check("params", title, FAILED,
                         f"after step {n} the ranks' parameters differ ({sums}): gradients are not averaged across "
                         "ranks (no DDP wrap / hvd.DistributedOptimizer) or the ranks did not start from rank 0's "
                         "weights (no broadcast; verify initialises ranks other than 0 differently on purpose)",
                         _where(sources, sites.get(opt)))
    n_opts = len({opt for opt, _ in steps})
    last = max(n for _, n in steps)
    sharded = max((e.get("sharded", 0) for by_rank in steps.values() for e in by_rank.values()), default=0)
    gathered = " (sharded parameters gathered whole before comparing)" if sharded else ""
    return Check("params", title, HELD, f"{n_opts} optimizer{'s' if n_opts > 1 else ''}, {len(ranks)} ranks bit-identical "
                                        f"after each of {last} steps{gathered}", _where(sources, *sites.values()))


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
        return Check("sharded", title, NOT_EXERCISED, "no optimizer stepped", prove=_TRAIN_PROVE)
    for opt, evs in sorted(steps.items()):
        if not any(e.get("sharded") for e in evs):
            return Check("sharded", title, FAILED,
                         f"optimizer {opt} holds no sharded (DTensor) parameter: it was built before fully_shard (it "
                         "then updates tensors the model no longer uses) or its model is not sharded (its updates "
                         "are not averaged); build it after fully_shard(model)", _where(sources, sites.get(opt)))
        if len(evs) >= 2 and evs[0]["sha"] == evs[-1]["sha"]:
            return Check("sharded", title, FAILED,
                         f"optimizer {opt}'s parameters did not change from step {evs[0]['n']} to step {evs[-1]['n']}: "
                         "it updates nothing (built before fully_shard?)", _where(sources, sites.get(opt)))
    if all(len(evs) < 2 for evs in steps.values()):
        return Check("sharded", title, NOT_EXERCISED, "one step only: whether the parameters change is not seen",
                     prove="run two optimizer steps or more")
    return Check("sharded", title, HELD, f"{len(steps)} optimizer{'s' if len(steps) > 1 else ''} over sharded parameters "
                                         "that change with each step", _where(sources, *sites.values()))


# --- data ---------------------------------------------------------------------------------------


def _loaders(events: Dict[int, List[dict]]) -> Tuple[Dict[int, dict], set]:
    """(loader id -> its first `loader` record, ids of the loaders whose batches fed an optimizer step)."""
    loaders, train = {}, set()
    for evs in events.values():
        for e in evs:
            if e["k"] == "loader":
                loaders.setdefault(e["id"], e)
            elif e["k"] == "train":
                train.add(e["loader"])
    return loaders, train


def _training_loaders(events: Dict[int, List[dict]]) -> Dict[int, dict]:
    loaders, train = _loaders(events)
    return {lid: loaders[lid] for lid in sorted(train) if lid in loaders}


def _passes(events: Dict[int, List[dict]], lid: int) -> Dict[int, Dict[int, Tuple[List[int], bool]]]:
    """pass -> rank -> (indices in order, complete: the pass ended by itself, not cut short by verify)."""
    out: Dict[int, Dict[int, Tuple[List[int], bool]]] = {}
    for rank, evs in events.items():
        for e in evs:
            if e["k"] == "batch" and e["loader"] == lid:
                idx, done = out.setdefault(e["p"], {}).setdefault(rank, ([], False))
                idx.extend(e["i"])
            elif e["k"] == "end" and e["loader"] == lid:
                idx, _ = out.setdefault(e["p"], {}).get(rank, ([], False))
                out[e["p"]][rank] = (idx, not e.get("cut"))
    return out


def _training_or_absent(name: str, title: str, events: Dict[int, List[dict]]) -> Tuple[Optional[Check], Dict[int, dict]]:
    """(None, the training loaders), or (the check's outcome when no DataLoader fed a step, {})."""
    loaders, _ = _loaders(events)
    training = _training_loaders(events)
    return (None, training) if training else (_absent(name, title, events, bool(loaders)), {})


def _absent(name: str, title: str, events: Dict[int, List[dict]], loaders: bool) -> Check:
    stepped = any(e["k"] == "step" for evs in events.values() for e in evs)
    if not loaders:
        return Check(name, title, NOT_APPLICABLE, "the script builds no DataLoader")
    if stepped:
        return Check(name, title, NOT_APPLICABLE, "the optimizer steps on batches no DataLoader yields")
    return Check(name, title, NOT_EXERCISED, "no DataLoader fed an optimizer step", prove=_TRAIN_PROVE)


def check_shards(events: Dict[int, List[dict]], sources: Sources) -> Check:
    title = "ranks read disjoint shards that cover the data"
    absent, loaders = _training_or_absent("shards", title, events)
    if absent:
        return absent
    ranks = sorted(events)
    nranks = len(ranks)
    notes = []
    unseen = [lid for lid in loaders if not any(idx for by in _passes(events, lid).values() for idx, _ in by.values())]
    if len(unseen) == len(loaders):
        return Check("shards", title, NOT_APPLICABLE, "the training loader yields no sample indices to compare (an "
                                                      "IterableDataset stream, or a sampler of non-integer keys)",
                     _where(sources, *(loaders[lid]["site"] for lid in unseen)))
    sampler_lens = {}
    for rank, evs in events.items():
        for e in evs:
            if e["k"] == "loader" and e["id"] in loaders:
                sampler_lens.setdefault(e["id"], {})[rank] = e.get("sampler_len")
    for lid, info in loaders.items():
        where = _where(sources, info["site"])
        length = info.get("len")
        allowed = (nranks - 1) + (nranks * (info["batch_size"] - 1) if info.get("drop_last") and info.get("batch_size") else 0)
        complete_seen = False
        for p, by_rank in sorted(_passes(events, lid).items()):
            seen = [i for r in ranks for i in by_rank.get(r, ([], False))[0]]
            unique = set(seen)
            repeated = len(seen) - len(unique)
            if repeated > nranks - 1:
                counts: Dict[int, int] = {}
                for r in ranks:
                    for i in set(by_rank.get(r, ([], False))[0]):
                        counts[i] = counts.get(i, 0) + 1
                shared = sum(1 for c in counts.values() if c > 1)
                return Check("shards", title, FAILED,
                             f"pass {p}: {shared} samples were read by more than one rank ({len(seen)} reads of "
                             f"{len(unique)} samples): the training loader has no per-rank sampler", where)
            complete = len(by_rank) == nranks and all(done for _, done in by_rank.values())
            if complete and length:
                complete_seen = True
                missing = length - len(unique & set(range(length)))
                if missing > allowed:
                    return Check("shards", title, FAILED,
                                 f"pass {p}: the ranks together read {len(unique)} of {length} samples ({missing} never read)", where)
                notes.append(f"pass {p}: {' + '.join(str(len(by_rank[r][0])) for r in ranks)} of {length} samples, "
                             f"{repeated} padding")
        if not complete_seen and length:
            lens = sampler_lens.get(lid, {})
            if len(lens) == nranks and all(isinstance(v, int) for v in lens.values()):
                held = sum(lens.values())
                if held < length - allowed:
                    return Check("shards", title, FAILED, f"the ranks' samplers together hold {held} of {length} samples", where)
                notes.append(f"disjoint over the samples read before the passes were cut short; the ranks' samplers "
                             f"hold {' + '.join(str(lens[r]) for r in ranks)} of {length} samples")
            else:
                return Check("shards", title, NOT_EXERCISED, "disjoint as far as read, but no pass over the training "
                                                             "data finished, so coverage is not seen", where,
                             prove="run with --steps 0 and a short epoch")
    return Check("shards", title, HELD, "; ".join(notes[:3]) or "disjoint", _where(sources, *(i["site"] for i in loaders.values())))


def _at(info: dict, lid: int) -> str:
    return f"{info['site'][0]}:{info['site'][1]}" if info.get("site") else f"loader {lid}"


def check_order(events: Dict[int, List[dict]], sources: Sources) -> Check:
    title = "a shuffled order changes between passes"
    absent, loaders = _training_or_absent("order", title, events)
    shuffled = {lid: info for lid, info in loaders.items() if info.get("shuffle")}
    if absent:
        return absent
    if not shuffled:
        named = "; ".join(f"{_at(info, lid)} draws with a {info.get('sampler')}" for lid, info in loaders.items())
        return Check("order", title, NOT_APPLICABLE, f"the training loader does not shuffle ({named}): the same order "
                                                     "every pass is what it asks for", _where(sources, *(i["site"] for i in loaders.values())))
    notes = []
    for lid, info in shuffled.items():
        passes = _passes(events, lid)
        where = _where(sources, info["site"])
        if 1 not in passes:
            return Check("order", title, NOT_EXERCISED, "the run made one pass over the training data, so a repeated "
                                                        "order cannot show", where, prove="run 2 epochs or more (e.g. --epochs 2)")
        for rank in sorted(events):
            first = passes[0].get(rank, ([], False))[0]
            second = passes[1].get(rank, ([], False))[0]
            n = min(len(first), len(second))
            if n and first[:n] == second[:n]:
                return Check("order", title, FAILED,
                             f"rank {rank} read passes 0 and 1 in the same order: the DistributedSampler needs "
                             "set_epoch(epoch) at the start of every pass", where)
        notes.append(f"{_at(info, lid)}: pass 1 differs from pass 0 on every rank")
    return Check("order", title, HELD, "; ".join(notes), _where(sources, *(i["site"] for i in shuffled.values())))


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
    same = [key for key in loop_sites if len(draws[key]) > 1 and len({tuple(v) for v in draws[key].values()}) == 1]
    if same:
        return Check("random", title, FAILED, "every rank drew the same indices at each step: the draw needs a per-rank "
                                              "generator or seed", _where(sources, *same))
    return Check("random", title, HELD, f"{len(loop_sites)} draw site(s) in the training loop differ between ranks",
                 _where(sources, *loop_sites))


# --- side effects -------------------------------------------------------------------------------


def _ignored_write(path: str, records_root: str) -> bool:
    """The probe's own records and Python's bytecode caches."""
    return path.endswith((".pyc", ".pyo")) or path.startswith(records_root) or "/__pycache__/" in path


def _unreached_saves(runs: Sequence[Run], facts: ScriptFacts, script_rel: str) -> List[Site]:
    """The save sites of the project's modules that no write of `runs` came from."""
    written = {tuple(e["site"]) for run in runs if not run.skipped for evs in run.events().values() for e in evs
               if e["k"] == "write" and e.get("site")}
    return [s for s in facts.saves if not any(path == (s.path or script_rel) and s.covers(line) for path, line in written)]


def _unreached_check(name: str, title: str, unreached: List[Site], sources: Sources) -> Check:
    many = len(unreached) > 1
    return Check(name, title, NOT_EXERCISED,
                 f"{len(unreached) if many else 'a'} save{'s' if many else ''} of the script never ran in the multi-process run",
                 [{"path": s.path or sources.script_rel, "line": s.first, "source": s.source} for s in unreached],
                 prove="run with script arguments that reach the save (it is under a condition these arguments do not "
                       "meet, e.g. a --save option)")


def check_writers(run: Run, sources: Sources, records_root: str, facts: ScriptFacts, reach: Reach) -> Check:
    title = "one rank writes each file"
    writers: Dict[str, Dict[int, list]] = {}
    for rank, evs in run.events().items():
        for e in evs:
            if e["k"] == "write" and not _ignored_write(e["path"], records_root):
                writers.setdefault(e["path"], {}).setdefault(rank, []).append(e.get("site"))
    sandbox = str(run.sandbox.resolve())
    shown = lambda p: os.path.relpath(p, sandbox) if p.startswith(sandbox + os.sep) else p  # noqa: E731
    shared = {p: by for p, by in writers.items() if len(by) > 1}
    if shared:
        path, by = sorted(shared.items())[0]
        sites = [s for r in sorted(by) if r != 0 for s in by[r]] + by.get(0, [])
        more = f" (and {len(shared) - 1} more)" if len(shared) > 1 else ""
        return Check("writers", title, FAILED, f"{shown(path)} was written by ranks {sorted(by)}{more}", _where(sources, *sites))
    if not reach.end:
        return Check("writers", title, NOT_EXERCISED, reach.why, prove=reach.prove)
    unreached = _unreached_saves([run], facts, sources.script_rel)
    if unreached:
        return _unreached_check("writers", title, unreached, sources)
    # temporary files libraries made and removed outside the sandbox (gloo's, torch's) are judged, not listed
    listed = {p: by for p, by in writers.items() if p.startswith(sandbox + os.sep) or os.path.exists(p)}
    if not listed:
        return Check("writers", title, NOT_APPLICABLE, "the script wrote no file in a run to its end, and it has no "
                                                       "torch.save")
    names = ", ".join(f"{shown(p)} (rank {next(iter(by))})" for p, by in sorted(listed.items())[:4])
    more = f" and {len(listed) - 4} more" if len(listed) > 4 else ""
    others = len(writers) - len(listed)
    more += f" (+{others} temporary file{'s' if others > 1 else ''} already removed)" if others else ""
    return Check("writers", title, HELD, f"{len(listed)} file{'s' if len(listed) != 1 else ''}: {names}{more}")


def check_prefix(runs: Sequence[Run], original: Optional[Run], sources: Sources, facts: ScriptFacts, reach: Reach) -> Check:
    title = "saved state has no wrapper prefix"
    saves = [(run, e) for run in runs if not run.skipped for evs in run.events().values() for e in evs
             if e["k"] == "write" and e.get("how") == "torch.save" and "prefixed" in e]
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
        return Check("prefix", title, FAILED, f"{os.path.relpath(e['path'], str(run.sandbox.resolve()))} holds a state_dict whose keys "
                                              "start with 'module.' (save the unwrapped model: model.module)", _where(sources, e.get("site")))
    if not reach.end:
        return Check("prefix", title, NOT_EXERCISED, reach.why, prove=reach.prove)
    unreached = _unreached_saves(runs[1:], facts, sources.script_rel)
    if unreached:
        return _unreached_check("prefix", title, unreached, sources)
    if not saves:
        return Check("prefix", title, NOT_APPLICABLE, "the script saves nothing with torch.save")
    return Check("prefix", title, HELD, f"{len({e['path'] for _, e in saves})} torch.save target(s), no 'module.' prefix")


_NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def check_prints(events: Dict[int, List[dict]], sources: Sources, reach: Reach) -> Check:
    title = "log lines are printed once"
    printed: Dict[str, Dict[int, list]] = {}
    total = 0
    for rank, evs in events.items():
        for e in evs:
            if e["k"] == "out" and e["text"].strip():
                total += 1
                key = _NUMBER.sub("#", e["text"].strip())
                printed.setdefault(key, {}).setdefault(rank, []).append(e.get("site"))
    twice = {k: by for k, by in printed.items() if len(by) > 1}
    if twice:
        line, by = next(iter(twice.items()))
        sites = [s for r in sorted(by) if r != 0 for s in by[r][:1]]
        return Check("prints", title, FAILED, f"{len(twice)} line(s) printed by ranks {sorted(by)}, e.g. {line[:80]!r}", _where(sources, *sites))
    if not reach.end:
        return Check("prints", title, NOT_EXERCISED, reach.why, prove=reach.prove)
    if not printed:
        return Check("prints", title, NOT_APPLICABLE, "the script printed nothing to stdout in a run to its end")
    return Check("prints", title, HELD, f"{total} line{'s' if total != 1 else ''} on stdout, each from one rank")


def check_metrics(events: Dict[int, List[dict]], sources: Sources, reach: Reach) -> Check:
    """An evaluation over sharded data reduces what it measured: after each pass of a loader that feeds
    no optimizer step and whose ranks read disjoint samples, some collective (all_reduce, all_gather,
    hvd.allreduce, ...) runs on rank 0 before its next optimizer step or pass."""
    title = "evaluation over sharded data is reduced across ranks"
    loaders, train = _loaders(events)
    evaluated = {lid: info for lid, info in loaders.items() if lid not in train}
    if not evaluated:
        return Check("metrics", title, NOT_APPLICABLE, "the script has no DataLoader besides the training one")
    ranks = sorted(events)
    rank0 = events.get(0, [])
    sharded_passes, whole_passes, reducers = 0, 0, []
    for lid, info in evaluated.items():
        for p, by_rank in sorted(_passes(events, lid).items()):
            sets = [set(by_rank[r][0]) for r in ranks if by_rank.get(r, ([], False))[0]]
            if not sets:
                continue
            reads = sum(len(s) for s in sets)
            if len(sets) < 2 or reads - len(set().union(*sets)) > len(ranks) - 1:
                whole_passes += 1
                continue
            sharded_passes += 1
            last = max((i for i, e in enumerate(rank0) if e["k"] == "batch" and e["loader"] == lid and e["p"] == p), default=None)
            if last is None:
                continue
            found = None
            for e in rank0[last + 1:]:
                if e["k"] == "coll":
                    found = e
                    break
                if e["k"] == "step" or (e["k"] == "pass" and (e["loader"] in train or e["loader"] == lid)):
                    break
            if found is None:
                return Check("metrics", title, FAILED,
                             f"pass {p} of the loader at {_at(info, lid)} is sharded across ranks (rank 0 read "
                             f"{len(by_rank.get(0, ([], 0))[0])} of its samples), but no collective (all_reduce, all_gather, "
                             "hvd.allreduce) follows it on rank 0: what the script computes from it covers one shard",
                             _where(sources, info["site"]))
            reducers.append(found.get("site"))
    if sharded_passes:
        return Check("metrics", title, HELD, f"{sharded_passes} sharded evaluation pass{'es' if sharded_passes > 1 else ''}, "
                                             "each followed by a collective on rank 0", _where(sources, *reducers))
    if whole_passes:
        return Check("metrics", title, HELD, f"{whole_passes} evaluation pass{'es' if whole_passes > 1 else ''}, each over "
                                             "the whole set on every rank reading it: nothing to reduce")
    if not reach.end:
        return Check("metrics", title, NOT_EXERCISED, reach.why, prove=reach.prove)
    shown = ", ".join(_at(info, lid) for lid, info in evaluated.items())
    return Check("metrics", title, NOT_EXERCISED, f"the loader at {shown} was never iterated",
                 _where(sources, *(i["site"] for i in evaluated.values())), prove="run with script arguments that evaluate")


# --- against the original -----------------------------------------------------------------------


def _seeded_passes(events: Dict[int, List[dict]], lid: int) -> List[List[int]]:
    """[seed, epoch] of each pass of loader `lid` on rank 0, when its sampler has both (DistributedSampler)."""
    passes = sorted((e["p"], e["seed"], e["epoch"]) for e in events.get(0, [])
                    if e["k"] == "pass" and e["loader"] == lid and isinstance(e.get("seed"), int) and isinstance(e.get("epoch"), int))
    return [[seed, epoch] for _, seed, epoch in passes]


def training_permutations(events: Dict[int, List[dict]]) -> Dict[str, List[List[int]]]:
    """loader id -> [seed, epoch] of each pass, for the shuffling training loaders whose sampler has a
    seed and an epoch (DistributedSampler): what the original's RandomSampler must draw."""
    out: Dict[str, List[List[int]]] = {}
    for lid, info in _training_loaders(events).items():
        passes = _seeded_passes(events, lid) if info.get("shuffle") else []
        if passes:
            out[str(lid)] = passes
    return out


def _aligned(multi: Dict[int, List[dict]], original: Dict[int, List[dict]], lid: int) -> bool:
    """The original drew the ranks' permutation for loader `lid`: the probe reseeded its RandomSampler,
    or it is a DistributedSampler of one replica (an --as-is original) whose passes have the ranks'
    seeds and epochs (one replica draws randperm(n) from seed + epoch and keeps all of it)."""
    if any(e["k"] == "aligned" and e["loader"] == lid for evs in original.values() for e in evs):
        return True
    info = next((e for e in original.get(0, []) if e["k"] == "loader" and e["id"] == lid), {})
    ours, theirs = _seeded_passes(multi, lid), _seeded_passes(original, lid)
    n = min(len(ours), len(theirs))
    return info.get("sampler") == "DistributedSampler" and info.get("replicas") == 1 and n > 0 and ours[:n] == theirs[:n]


_GENERATOR_TITLES = {"torch": "torch's generator", "random": "Python's random", "numpy.random": "numpy.random"}
# generator objects whose constructor the probe does not wrap (classes it must not replace): it cannot
# see them draw, so a draw from one is taken as randomness the runs do not share
_UNWATCHED = frozenset({"numpy.random.Generator", "numpy.random.RandomState", "numpy.random.mtrand.RandomState",
                        "random.SystemRandom"})


def _randomness(run: Run, train: set, sources: Optional[Sources], upto: int, facts: Optional[ScriptFacts] = None) -> List[str]:
    """What draws random numbers that the runs cannot draw alike, in `run` (rank 0, its data workers
    included) up to step `upto`: randomness in the training steps or while training batches are made,
    and draws before training from a generator nobody seeded; with the lines when `sources` holds the
    text the run ran (the probe's sites, else the draw sites of `facts`)."""
    evs = run.events().get(0, [])

    def lines(sites) -> str:
        shown = _where(sources, *sites)[:2] if sources is not None else []
        return " (" + ", ".join(f"{w['path']}:{w['line']}: {w['source']}" for w in shown) + ")" if shown else ""

    def sites_of(lib: str, phases) -> list:
        seen = [e["site"] for e in evs if e["k"] == "draw" and e["lib"] == lib and e["phase"] in phases and e.get("site")]
        if not seen and facts is not None:  # the probe sees every call of the modules' functions: a method of a generator drew
            seen = [[d.path, d.first] for d in facts.draws if d.lib == lib and d.via]
        return seen

    found = []
    drops = [e.get("site") for e in evs if e["k"] == "dropout"]
    if drops:
        found.append("dropout" + lines(drops))
    # (a draw in a Dataset's __getitem__ from a global generator, which the probe seeds by sample index in both
    # runs, is "aligned": the ranks and the original draw the same numbers for the same sample)
    for lib in sorted({e.get("lib", "torch") for e in evs if e["k"] == "datarng" and e["loader"] in train and not e.get("aligned")}):
        where = lines(sites_of(lib, ("data",))) if lib != "torch" else ""
        found.append(f"the training data pipeline draws from {_GENERATOR_TITLES.get(lib, lib)} while batches are "
                     f"made (augmentation, a random dataset){where}")
    stepped = [e for e in evs if e["k"] == "step" and e["n"] <= upto]
    for lib in sorted({lib for e in stepped for lib in e.get("rngs", ())}):
        found.append(f"the training step draws from {_GENERATOR_TITLES.get(lib, lib)}{lines(sites_of(lib, ('train',)))}")
    unseeded = [e["site"] for e in evs if e["k"] == "draw" and e["phase"] == "setup" and not e.get("seeded") and e.get("site")]
    unseeded += [site for e in evs if e["k"] == "gens" for lib, site, seeded in e["drew"] if not seeded and site]
    if unseeded:
        found.append("the script draws before training from a generator it does not seed, so the original and the "
                     f"ranks start from different numbers{lines(unseeded)}")
    unwatched = [[d.path, d.first] for d in (facts.draws if facts is not None else ()) if d.via in _UNWATCHED]
    if unwatched:
        found.append(f"the script draws from a generator object verify cannot watch{lines(unwatched)}")
    windows: Dict[tuple, set] = {}
    for e in evs:
        if e["k"] == "rand" and e.get("site"):
            windows.setdefault(tuple(e["site"]), set()).add(e["w"])
    loop = [list(site) for site, w in windows.items() if len(w) >= 2]  # drawn at every step, not once
    if loop:
        found.append("torch.randint/randperm in the training loop" + lines(loop))
    if not found and any(e.get("rng") for e in stepped):
        found.append("the training step draws from torch's global generator (torch.rand/randn/bernoulli or a "
                     "random layer)")
    return found


def check_weights(multi: Run, original: Run, nproc: int, batch_note: str, diff: dict, sources: Sources,
                  facts: Optional[ScriptFacts] = None) -> Check:
    title = f"weights equal the original's at {nproc} x batch"
    if original.skipped or multi.skipped:
        return Check("weights", title, NOT_EXERCISED, original.skipped or multi.skipped, prove="install what the runs need")
    if not original.ok:
        return Check("weights", title, FAILED, f"the original script failed at {batch_note}: exit status {original.returncode}"
                                               f"{' (timed out)' if original.timed_out else ''}{_tail(original.output)}")
    shots = [next((e["n"] for e in run.events().get(0, []) if e["k"] == "snapshot"), None) for run in (multi, original)]
    if None in shots or "error" in diff:
        why = diff.get("error") or "a run took no snapshot of its weights (no optimizer step)"
        return Check("weights", title, NOT_EXERCISED, why, prove=_TRAIN_PROVE)
    if shots[0] != shots[1]:
        return Check("weights", title, NOT_EXERCISED, f"the runs ended after different numbers of steps ({shots[0]} with "
                                                      f"{nproc} processes, {shots[1]} for the original)", prove="lower --steps")
    value = f"max |difference| {diff['max_abs_diff']:.3g} after {shots[0]} steps (original run at {batch_note})"
    loaders = _training_loaders(multi.events())
    train = set(loaders)
    random = _randomness(multi, train, sources, shots[0], facts) or _randomness(original, train, None, shots[0])
    if random:
        return Check("weights", title, NOT_EXERCISED, f"{value}, not judged: randomness besides the shuffle makes the runs "
                                                      f"differ: {'; '.join(dict.fromkeys(random))}",
                     prove="turn that randomness off for the check (e.g. dropout p=0), or rely on the other checks")
    unaligned = [lid for lid, info in loaders.items() if info.get("shuffle") and not _aligned(multi.events(), original.events(), lid)]
    if unaligned:
        at = ", ".join(_at(loaders[lid], lid) for lid in unaligned)
        return Check("weights", title, NOT_EXERCISED, f"{value}, not judged: the training loader at {at} shuffles and the "
                                                      "original's could not be given the ranks' permutation (it does not draw "
                                                      "with a plain RandomSampler, or the ranks' sampler has no seed/epoch)",
                     prove="compare with shuffling off")
    shuffled = " (the original drew the ranks' shuffle)" if any(info.get("shuffle") for info in loaders.values()) else ""
    if any(e["k"] == "datarng" and e.get("aligned") and e["loader"] in train for e in multi.events().get(0, [])):
        shuffled += " (each sample's random augmentation drawn from generators seeded by its index, in both runs)"
    status = HELD if diff["max_abs_diff"] <= WEIGHTS_ATOL else FAILED
    return Check("weights", title, status, f"{value}{shuffled}; tolerance {WEIGHTS_ATOL:g}")
