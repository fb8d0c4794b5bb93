"""DST962 the rewritten script reads a name where nothing binds it: refused."""

from __future__ import annotations

from typing import List

from distify.findings import Finding
from distify.rules.base import Context, Rule


class UnboundName(Rule):
    """Refuse an output that reads a name where nothing binds it.

    What it does:
        Checks distify's own output against its input, after every rule has edited it and before
        anything is written: every name the output reads must be bound (assigned, imported, a
        parameter, a builtin) in a scope the read can see, unless the input already read that name
        unbound in the same scope (a star import, a global set elsewhere). A read that fails is
        reported with the name and the function it sits in, and the file is refused (left as it
        was, exit 3). It rewrites nothing; the engine runs it on the rewritten module (it needs
        both versions), with CPython's symbol tables, only when the output differs from the input.

    Why:
        An edit is written in one scope from facts found in another: an accumulation count read in
        the training function (``accumulation_steps``, its parameter) is what Horovod's wrap needs
        where the optimizer is built (``main``, where only ``args.accumulation_steps`` exists). An
        output that reads an unbound name compiles, and then fails with NameError on every rank
        at the first step, or, in a branch that runs rarely, late in a long run. Refusing the file
        says where; writing it would hide the mistake until the job runs.

    Example:
        def main():
            ...
            optimizer = hvd.DistributedOptimizer(optimizer, backward_passes_per_step=accumulation_steps)

        is refused: "the rewritten script would read `accumulation_steps` in main(), where nothing
        binds it (NameError when it runs): file not migrated"
    """

    code = "DST962"
    name = "unbound-name"
    summary = "refuse an output that reads a name where nothing binds it"

    def apply(self, ctx: Context) -> None:
        """Nothing to do on the input: see ``check_output``, which the engine calls on the result."""

    def check_output(self, before: str, after: str) -> List[Finding]:
        """Warnings for the reads ``after`` (the output's source) makes of unbound names that
        ``before`` (the input's) did not make, with lines in ``after``."""
        from distify.scopes import new_unbound_reads

        found = new_unbound_reads(before, after)
        lines = after.splitlines()
        out = []
        for name, path, line in found:
            named = [p for p in path if p != "<comprehension>"]
            where = f"in {'.'.join(named)}()" if named else "at module level"
            text = _around(lines[line - 1].strip(), name)
            # the line is the output's (the engine maps it to the user's nearest one), so no column
            out.append(Finding(
                self.code, line, 1,
                f"the rewritten script would read `{name}` {where}, where nothing binds it (NameError when it "
                f"runs), in `{text}`: file not migrated; this is a distify bug, please report it with the script",
                kind="warning",
            ))
        return out


def _around(text: str, name: str, width: int = 90) -> str:
    """The line, or the part of a long one around the first place it reads ``name``."""
    if len(text) <= width:
        return text
    at = max(text.find(name), 0)
    start = max(0, min(at - width // 2, len(text) - width))
    return ("..." if start else "") + text[start:start + width] + ("..." if start + width < len(text) else "")


RULE = UnboundName()
