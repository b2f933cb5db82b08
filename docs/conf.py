"""Sphinx configuration of the torchrl-acer documentation.

Build with ``sphinx-build -W --keep-going -b html docs docs/_build/html`` after
``pip install -e ".[docs]"`` (the API pages import the package, so the
``examples`` and ``atari`` extras are needed for the training modules).
"""

from __future__ import annotations

import sys
from importlib.metadata import version as _version
from pathlib import Path

from sphinx.util.inspect import signature as sphinx_signature
from sphinx.util.inspect import stringify_signature

# the package imports from the checkout even when it is not installed
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

project = "torchrl-acer"
author = "torchrl-acer developers"
copyright = "torchrl-acer developers, MIT license"
try:
    release = _version("torchrl-acer")
except Exception:  # not installed: the checkout is still documented
    release = "0.1.0"
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# No intersphinx: the build runs without network. References to torch, tensordict
# and torchrl objects stay plain text; with nitpicky off they do not warn.
nitpicky = False

# -- autodoc -----------------------------------------------------------------
autodoc_default_options = {
    "members": True,
    "member-order": "bysource",
    "show-inheritance": True,
}
autodoc_typehints = "signature"
autodoc_class_signature = "mixed"
autoclass_content = "class"
autodoc_inherit_docstrings = False
# MathJax renders the ``.. math::`` blocks and ``:math:`` roles of the docstrings.

# -- napoleon (Google-style "Args:" / "Keyword Args:" / "Examples:") ----------
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_include_init_with_doc = False
napoleon_use_param = True
napoleon_use_rtype = False
napoleon_use_ivar = True
napoleon_attr_annotations = True

# -- MyST (the README's guides are included, not copied) ----------------------
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3

# -- HTML ------------------------------------------------------------------------
html_theme = "furo"
html_title = f"torchrl-acer {release}"
html_static_path: list[str] = []


# -- hooks -------------------------------------------------------------------------
def _init_signature(app, what, name, obj, options, signature, return_annotation):
    """Shows ``__init__``'s signature for classes whose base defines a ``__new__``.

    TorchRL's ``LossModule`` and tensordict's ``TensorDictModuleBase`` define
    ``__new__(cls, *args, **kwargs)``, which autodoc prefers to ``__init__``: every
    loss and module would read ``(*args, **kwargs)``.
    """
    if what != "class" or signature != "(*args, **kwargs)":
        return None
    try:
        sig = sphinx_signature(obj.__init__, bound_method=True)
    except (TypeError, ValueError):
        return None
    text = stringify_signature(
        sig, show_return_annotation=False, unqualified_typehints=True
    )
    return text, return_annotation


def _property_summary(app, what, name, obj, options, lines):
    """Keeps napoleon from reading ``summary: more`` as ``type: description``.

    Napoleon splits the first line of a property's docstring at a colon and takes
    the left side as the type. The type comes from the return annotation here, so
    an empty type is put in front (this runs before napoleon's handler).
    """
    if what == "property" and lines and lines[0].strip():
        lines[0] = ": " + lines[0]


def setup(app):
    app.connect("autodoc-process-signature", _init_signature)
    app.connect("autodoc-process-docstring", _property_summary, priority=400)
