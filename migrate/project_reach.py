"""The fact layer's question to the user's project: what function a qualified name of the script is.

``Facts.project`` holds a ``ProjectReach`` for a script that is a file. The program model of the
project (``distify.program``: its modules read and analysed) is built on the first question that a
module of the project can answer, so a script that hands its model to no function of another module
of its project pays nothing for it, not even the import of the program model: whether a module of
the project holds a name is a few file lookups (``Project.locate``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import libcst as cst

if TYPE_CHECKING:
    from distify.program import Program
    from distify.project import Project


class ProjectReach:
    """What a qualified name of the script at `path` is in its project, for the fact layer
    (``Facts.project``): ``(facts, qualname, function, bound)`` of the project function it names
    and the arguments a call binds to its parameters, or None."""

    def __init__(self, path: str, options) -> None:
        self.path, self._options = path, options
        self._project: Optional[Project] = None
        self._prog: Optional[Program] = None

    def project(self) -> Project:
        """The project around the script: its modules are found on demand, none is read yet."""
        if self._project is None:
            from distify.project import Project

            self._project = Project.around(
                self.path, getattr(self._options, "project_root", None), tuple(getattr(self._options, "exclude", ()))
            )
        return self._project

    def program(self) -> Program:
        """The program model around the script, built on first use (``reached`` shares it)."""
        if self._prog is None:
            from distify.program import Program

            self._prog = Program(self.project())
        return self._prog

    def joined(self, source: bytes):
        """For ``distify.anatomy.analyse`` of the script: its relative imports (``from . import
        utils``) made absolute, which its own import statements cannot say; None for a script whose
        text holds none (no project is built for it)."""
        from distify.project import RELATIVE_IMPORT

        if not RELATIVE_IMPORT.search(source):
            return None
        project = self.project()
        return {}, project.relative_aliases(project.script(self.path))

    def __call__(self, q: str, call: cst.Call):
        if self.project().locate(q) is None:
            return None  # no module of the project holds it (torch.zeros, random.random): nothing to analyse
        from distify.names import resolve
        from distify.program import _DEPTH, Target

        prog = self.program()
        target = prog._named(q, _DEPTH)
        if not isinstance(target, Target):
            return None
        unit = target.unit
        return unit.anatomy.facts, (lambda e: resolve(unit.aliases, e)), target.fn, prog.bind(target, call)
