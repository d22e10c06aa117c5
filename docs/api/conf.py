"""Sphinx configuration of metaq's Python API reference (``make docs``: docs/_build/html).

The pages are autodoc directives over the public modules: what they show is the code's own docstrings
and signatures, so the reference cannot drift from the code. ``make docs`` builds with warnings as
errors, as CI does.
"""

from __future__ import annotations

import os
import sys

# The sources of this checkout, not whatever metaq is installed (the venv's editable install points here
# too; a plain `sphinx-build` run from another environment then still documents this tree).
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "src")))

os.environ.setdefault("METAQ_NO_EXTENSIONS", "1")  # document the Python references, not the compiled twins

import metaq  # noqa: E402

project = "metaq"
author = "the metaq authors"
release = metaq.__version__
version = release

extensions = ["sphinx.ext.autodoc", "sphinx.ext.viewcode"]
root_doc = "index"
exclude_patterns = ["_build"]

# Docstrings say `name` for code, as the Markdown pages do: render it as code, not as a reference.
default_role = "code"
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
autodoc_default_options = {"members": True, "show-inheritance": True}
# Type hints name private or optional modules (pyspark, kazoo); a hint that cannot be resolved stays as
# written instead of failing the build.
autodoc_mock_imports = ["pyspark", "kazoo", "psycopg"]

html_theme = "alabaster"
html_title = f"metaq {release} API reference"
html_theme_options = {"description": "Python API reference", "fixed_sidebar": True}
