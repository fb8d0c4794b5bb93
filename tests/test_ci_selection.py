"""CI runs every test: the README's test command (.ci/run step 1) and step 2's `--full -m ...`
together select every test that `--full` collects.

The quick run leaves the end-to-end matrix and the cases of each sweep outside its sample (marked
`e2e` and `sweep`, see conftest.py) to `--full`; step 2 narrows `--full` by a marker expression to
what step 1 did not run on a torch. A mark added to the quick run's exclusions but not to that
expression would drop its tests from CI without a word: this test collects the three commands as
.ci/run writes them (.ci/collect.py, collection only) and compares.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_steps_together_run_every_test_full_collects():
    proc = subprocess.run([sys.executable, str(ROOT / ".ci" / "collect.py")], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    selected = {step: set(ids) for step, ids in json.loads(proc.stdout).items()}
    step1, step2, full = selected["step1"], selected["step2"], selected["full"]
    assert len(full) > 1000 and step1 and step2
    lost = sorted(full - step1 - step2)
    assert lost == [], f"{len(lost)} tests --full collects run in neither step of .ci/run: {lost[:20]}"
    assert step1 | step2 == full, sorted((step1 | step2) - full)[:20]
