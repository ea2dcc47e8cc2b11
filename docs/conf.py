"""Sphinx configuration of fpemu's documentation site (``make docs``).

The site is built from this folder alone: the committed pages, the pages
generated from the code by ``_ext/fpemu_pages.py`` into ``_generated/``, the
lesson notebooks (executed by myst-nb during the build) and the docstrings.
Warnings are errors (``sphinx-build -W``).
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))
os.environ["FPEMU_STATIC"] = "1"           # lesson widgets show static output
# The notebook kernels inherit this environment: they must draw with Jupyter's inline
# backend (figures become cell outputs), whatever the caller exported (the Makefile
# exports Agg). This process draws the gallery with Agg.
os.environ["MPLBACKEND"] = "module://matplotlib_inline.backend_inline"
import matplotlib  # noqa: E402

matplotlib.use("Agg", force=True)

import fpemu  # noqa: E402

project = "fpemu"
author = "the fpemu developers"
copyright = "2026, the fpemu developers"
release = version = fpemu.__version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "numpydoc",
    "sphinxcontrib.bibtex",
    "sphinx_copybutton",
    "sphinx_design",
    "fpemu_pages",
]

source_suffix = {".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"
exclude_patterns = ["_build", "Thumbs.db", ".DS_Store", "_ext", "**.ipynb_checkpoints",
                    "_generated/*-table.md", "_generated/*-results.md",
                    "_generated/cli-commands.md"]

# MyST: ```{directive} fences, $...$ is not math (prices, shell), headings get anchors
myst_enable_extensions = ["colon_fence", "deflist", "fieldlist"]
myst_heading_anchors = 3

# myst-nb: execute every notebook on each build; a failing cell fails the build
nb_execution_mode = "force"
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_merge_streams = True

# autodoc + numpydoc
autodoc_member_order = "bysource"
autodoc_typehints = "none"
numpydoc_show_class_members = False
numpydoc_validation_checks = set()
numpydoc_xref_param_type = False

bibtex_bibfiles = ["references.bib"]
bibtex_default_style = "plain"
bibtex_reference_style = "author_year"

html_theme = "furo"
html_title = f"fpemu {release}"
html_static_path = ["_static"]
html_css_files = ["fpemu.css"]
html_theme_options = {"navigation_with_keys": True}
html_last_updated_fmt = None
html_show_sourcelink = False
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
