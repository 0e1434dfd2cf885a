"""Every example in a docstring runs, so the examples on the API pages cannot rot.

The docs' own pages run their examples with Sphinx's doctest builder (``.. doctest::`` blocks, in CI).
The module and function docstrings that autodoc puts on the API page are run here instead, with the
module's own globals (as ``python -m doctest`` would), because an example in a module's docstring
may use the module's names without importing them. Each module with at least one example is one
case (examples marked ``+SKIP`` do not count); the examples run on the current backend (the
simulator without a GPU).
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import numba_flash
import numba_flash_reference

import pytest

#: Modules that must not be imported for their examples (``__main__`` runs the command line).
SKIP = {"numba_flash.__main__"}


def _modules_with_examples():
    names = []
    for pkg in (numba_flash, numba_flash_reference):
        for info in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
            if info.name in SKIP:
                continue
            module = importlib.import_module(info.name)
            if any(not ex.options.get(doctest.SKIP) for t in doctest.DocTestFinder().find(module) for ex in t.examples):
                names.append(info.name)  # at least one example that runs (``+SKIP`` ones do not)
    return names


@pytest.mark.parametrize("name", _modules_with_examples())
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    failed = []
    for test in doctest.DocTestFinder().find(module):
        runner.run(test, out=failed.append)
    assert runner.tries > 0, f"{name} has no example that runs"
    assert runner.failures == 0, "".join(failed)
