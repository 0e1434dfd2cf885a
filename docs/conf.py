"""Sphinx configuration for numba-flash.

Build (warnings are errors, as in CI)::

    python -m sphinx -W --keep-going -b html -d docs/_build/doctrees docs docs/_build/html
    python -m sphinx -W --keep-going -b doctest -d docs/_build/doctrees docs docs/_build/doctest
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# The docs build in Numba's CUDA simulator unless told otherwise, so that they build the same on
# every machine. ``import numba_flash`` must come before anything imports numba.cuda: it is what
# sets NUMBA_ENABLE_CUDASIM (see numba_flash/runtime/backend.py).
os.environ.setdefault("NUMBA_FLASH_BACKEND", "simulator")
import numba_flash

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))
sys.path.insert(1, str(DOCS.parent))  # the checkout's tools/ (the bug gallery page reads tools/bugs.py)

project = "numba-flash"
author = "numba-flash developers"
copyright = "2026, numba-flash developers"
release = numba_flash.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.doctest",
    "sphinx.ext.viewcode",
    "sphinx_copybutton",
    "code_marker",
    "io_table",
    "bench_table",
    "results_json",
    "test_claims",
    "bug_gallery",
]

root_doc = "index"
exclude_patterns = ["_build", "results/README.md", "Thumbs.db", ".DS_Store"]
templates_path: list[str] = []

# -- code markers (docs/_ext/code_marker.py): paths are relative to the repository root ----------
code_marker_root = str(DOCS.parent)

# -- autodoc + napoleon (numpydoc-style docstrings) ----------------------------------------------
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_typehints = "description"
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

# -- doctest: every example on a page runs (in the simulator) -----------------------------------
# The builder runs the ``.. doctest::`` blocks of the pages. Examples inside docstrings (which autodoc
# puts on the API page) use their module's globals, so tests/test_docs_examples.py runs those with
# Python's doctest, module by module; the builder leaves docstring blocks alone.
doctest_global_setup = """
import numpy as np
import numba_flash
"""
doctest_test_doctest_blocks = ""

# -- math ------------------------------------------------------------------------------------------
mathjax3_config = {
    "tex": {
        "macros": {
            "rowmax": r"\operatorname{rowmax}",
            "rowsum": r"\operatorname{rowsum}",
            "diag": r"\operatorname{diag}",
            "softmax": r"\operatorname{softmax}",
            "mask": r"\operatorname{mask}",
            "dropout": r"\operatorname{dropout}",
            "new": r"\mathrm{new}",
        }
    }
}

# -- HTML ------------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"numba-flash {release}"
html_static_path = ["_static"]
html_css_files = ["numba_flash.css"]
pygments_style = "sphinx"
pygments_dark_style = "monokai"
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
copybutton_only_copy_prompt_lines = False
