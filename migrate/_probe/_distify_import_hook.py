"""Run a patch on a module right after its first import: ``after_import("torch", patch)``.

Used by distify verify's probe (this folder is on its runs' PYTHONPATH, so the probe imports it as
a top-level module) and by the tests' spies (as ``distify._probe._distify_import_hook``). Standard
library only."""
import sys


def after_import(module_name, patch):
    """Have ``patch(module)`` run once, right after ``import module_name`` has executed the module's
    body (so its attributes exist) and before the importing code sees it; at once when the module is
    already imported (a process forked from a parent that imported it, as the tests' warm launcher)."""
    if module_name in sys.modules:
        patch(sys.modules[module_name])
        return

    class _ImportHook:
        def find_spec(self, name, path=None, target=None):
            if name != module_name:
                return None
            # one shot: remove ourselves, then let the normal finders locate the module
            sys.meta_path.remove(self)
            import importlib.util

            spec = importlib.util.find_spec(module_name)
            if spec is None or spec.loader is None:
                return spec
            real_exec = spec.loader.exec_module

            def exec_module(module):
                real_exec(module)
                patch(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _ImportHook())
