"""Sphinx configuration of conveyor's documentation site.

Build it with ``sphinx-build -W docs docs/_build/html`` (the README shows the whole
command). Warnings are errors and references to conveyor's own names are checked
(``nitpicky``): a broken link or an undocumented name fails the build.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

from sphinx.deprecation import RemovedInSphinx10Warning

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

import conveyor  # noqa: E402

# sphinx-autodoc-typehints calls an API Sphinx 10 removes, once per docstring: a warning
# about that package, not about these pages (Sphinx's own warnings stay errors).
warnings.filterwarnings("ignore", message=".*set_application.* is deprecated", category=RemovedInSphinx10Warning)

project = "conveyor"
author = "conveyor's authors"
copyright = "conveyor's authors"
release = conveyor.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx_autodoc_typehints",
    "sphinx_copybutton",
    "public_api",
    "op_catalogue",
    "design_sections",
    "performance_pages",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "DESIGN.md", "Thumbs.db", ".DS_Store"]

# Every reference to one of conveyor's names must resolve. Other projects' names
# (numpy, torch, the standard library) are not checked: the build must not need the
# network, which intersphinx would.
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?!conveyor\b).*")]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_class_signature = "mixed"
autoclass_content = "both"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
typehints_use_signature = False
typehints_use_signature_return = False
always_document_param_types = False  # a parameter counts as documented only when its docstring says so
typehints_document_rtype = True

html_theme = "furo"
html_title = f"conveyor {release}"
html_static_path: list[str] = []
html_show_sourcelink = False
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True

suppress_warnings: list[str] = []
