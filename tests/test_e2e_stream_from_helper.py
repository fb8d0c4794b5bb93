"""Executed: an IterableDataset built in a helper function is shared out across 2 ranks (issue 22,
item 4; DST910, fixtures/DST910/stream_from_helper, the language_translation shape).

``load_split`` returns the stream and ``get_data`` builds the training loader over it and returns
it; distify follows the helper's return to the stream's class and wraps it in runtime.ShareStream
(before, the loader got a DistributedSampler, which DataLoader rejects for a stream). The stream
and the model are deterministic: 2 ranks at batch 8, each reading every other item, must end with
the single process's weights at batch 16. Control: the same migrated script without the share
trains each rank on the whole stream and ends elsewhere.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_support import (  # noqa: E402
    REPO_ROOT, assert_same_weights, load_state, migrate, run_horovodrun, run_python, run_torchrun,
)

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST910" / "stream_from_helper.in.py"
SHARED = "DataLoader(runtime.ShareStream(train_iterator),"


@pytest.fixture(scope="module")
def single_process(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("original")
    run_python(SOURCE, ["--batch-size", "16"], cwd=work)
    return load_state(work / "final.pt")


@pytest.mark.parametrize(
    "backend,shared",
    [("ddp", True), ("ddp", False), pytest.param("horovod", True, marks=pytest.mark.horovod)],
    ids=["ddp", "control-ddp-whole-stream", "horovod"],
)
def test_stream_built_in_a_helper_is_shared(tmp_path, single_process, backend, shared):
    script = tmp_path / "train.py"
    migrate(SOURCE, script, backend=backend)
    text = script.read_text()
    assert SHARED in text, "the training stream was not shared out"
    if not shared:
        script.write_text(text.replace(SHARED, "DataLoader(train_iterator,"))
    run = run_torchrun if backend == "ddp" else run_horovodrun
    run(script, ["--batch-size", "8"], nproc=2, cwd=tmp_path)
    found = load_state(tmp_path / "final.pt")
    if shared:
        assert_same_weights(found, single_process, label=f"{backend} at 2 x 8 vs one process at 16")
    else:
        with pytest.raises(AssertionError):
            assert_same_weights(found, single_process)
