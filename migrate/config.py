"""``[tool.distify]`` from the nearest pyproject.toml. Command-line flags win."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional, Sequence

KEYS = {
    "backend", "select", "ignore", "exclude",
    "scale-lr", "scale_lr", "fp16-allreduce", "fp16_allreduce", "adasum", "seed-per-rank", "seed_per_rank",
    "standalone", "bf16",
    "nproc", "nodes", "port",  # distify --launch
    "project-root", "project_root",  # distify.project: where the user's project ends
}


class ConfigError(Exception):
    pass


def find_pyproject(paths: Sequence[str]) -> Optional[Path]:
    starts = [Path(p).resolve() for p in paths if p != "-"] or [Path.cwd()]
    start = starts[0]
    for d in [start if start.is_dir() else start.parent, *(start if start.is_dir() else start.parent).parents]:
        candidate = d / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load(paths: Sequence[str]) -> Dict[str, Any]:
    path = find_pyproject(paths)
    if path is None:
        return {}
    import tomllib  # standard library from 3.11, the oldest Python distify supports (pyproject.toml)

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"{path}: cannot read [tool.distify]: {e}") from None
    section = data.get("tool", {}).get("distify", {})
    unknown = set(section) - KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key(s) in [tool.distify]: {', '.join(sorted(unknown))}")
    out = {k.replace("-", "_"): v for k, v in section.items()}
    if "project_root" in out:  # relative to the pyproject.toml that says it
        if not isinstance(out["project_root"], str):
            raise ConfigError(f"{path}: [tool.distify] project-root must be a path (a string)")
        out["project_root"] = str((path.parent / out["project_root"]).resolve())
    return out
