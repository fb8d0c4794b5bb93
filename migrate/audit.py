"""The output audit: the invariants of a correct data-parallel script, checked on the result.

After the rules have rewritten a script, the engine analyses the *rewritten* module with the same
anatomy and runs the audit checks (``DST950``-``DST959``, one rule module each, subclasses of
``distify.rules.base.AuditCheck``)
on it; ``distify lint`` runs them on scripts that are already distributed. A rule is only a way to
reach the invariants (ARCHITECTURE.md, "The invariants of a correct migration"); the audit is what says
whether they hold, so a shape no rule knows comes out with a warning instead of silently wrong.

The checks ask the fact layer for every program fact (``distify.anatomy``, ``distify.facts``, and
``distify.parallel`` for wrapped and sharded models and the loops loaders feed); what is here is
the vocabulary they share: the audit's codes and which calls save files.
"""

from __future__ import annotations

AUDIT_CODES = tuple(f"DST95{i}" for i in range(10))

HVD_OPTIMIZER = {"horovod.torch.DistributedOptimizer"}
SAVES = {
    "torch.save",
    "torchvision.utils.save_image",
    "numpy.save",
    "numpy.savez",
    "numpy.savetxt",
    "matplotlib.pyplot.savefig",
}


def is_audit(rule) -> bool:
    return getattr(rule, "audit", False)
