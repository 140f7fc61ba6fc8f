"""Registered methods. Importing this package registers all (and all losses)."""

import mmcse.losses  # noqa: F401  (methods name losses; make sure they are registered)
from mmcse.methods import simcse  # noqa: F401
from mmcse.methods.base import Method, Term, build_method

__all__ = ["Method", "Term", "build_method"]
