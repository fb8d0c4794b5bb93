"""Executed: why DST104 refuses a second backward through a kept forward (distify.retained_graph).

The migration the rule refuses is run as it would have been written: fixtures/DST111/gan_no_detach
with each network wrapped in runtime.DDP (what distify wrote before the rule), on two ranks under
torchrun, each rank drawing its own data. The generator's gradients of the second backward are not
averaged, so the ranks end with different generators. Control: the same script with the
discriminator reading `fake.detach()` (a shape distify migrates) ends with the same weights on every
rank."""
from __future__ import annotations

import json

import pytest

from e2e_support import REPO_ROOT, run_torchrun

pytestmark = pytest.mark.e2e

SOURCE = REPO_ROOT / "fixtures" / "DST111" / "gan_no_detach.in.py"
DUMP = """
import json as _json, os as _os, torch.distributed as _dist
_sums = [round(float(sum(p.double().sum() for p in m.parameters())), 9) for m in (netG, netD)]
open(_os.path.join(_os.environ["DISTIFY_E2E_OUT"], f"rank{_dist.get_rank()}.json"), "w").write(_json.dumps(_sums))
"""


def _as_wrapped(source: str) -> str:
    """The script as a migration that wraps both networks would run it (DDP over gloo, CPU)."""
    head = "import torch.distributed as dist\nfrom distify import runtime\ndist.init_process_group(**runtime.init_kwargs())\n"
    out = source.replace('device = torch.device("cuda" if torch.cuda.is_available() else "cpu")', "device = runtime.device()")
    for net in ("netG", "netD"):
        line = next(l for l in out.splitlines() if l.startswith(f"{net} = "))
        out = out.replace(line, f"{line}\n{net} = runtime.DDP({net}, device_ids=runtime.device_ids())")
    out = out.replace("for step in range(100):", "torch.manual_seed(1000 + dist.get_rank())\nfor step in range(5):")
    return head + out + DUMP


def _ranks(tmp_path, name: str, source: str) -> list:
    script = tmp_path / name / "gan.py"
    script.parent.mkdir(parents=True)
    script.write_text(source)
    run_torchrun(script, nproc=2, env={"DISTIFY_E2E_OUT": str(script.parent)}, cwd=script.parent)
    return [json.loads((script.parent / f"rank{r}.json").read_text()) for r in range(2)]


def test_a_second_backward_through_a_ddp_forward_is_not_averaged(tmp_path):
    original = SOURCE.read_text()
    wrong = _ranks(tmp_path, "as_written", _as_wrapped(original))
    assert wrong[0][0] != wrong[1][0], f"the generators should drift apart: {wrong}"
    detached = original.replace("bce(netD(fake), torch.zeros", "bce(netD(fake.detach()), torch.zeros")
    assert detached != original
    right = _ranks(tmp_path, "detached", _as_wrapped(detached))
    assert right[0] == right[1], f"control: with fake.detach() every rank holds the same weights: {right}"
