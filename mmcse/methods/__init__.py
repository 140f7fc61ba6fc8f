"""Registered methods. Importing this package registers all (and all losses)."""

import mmcse.losses  # noqa: F401  (methods name losses; make sure they are registered)
from mmcse.methods import dalr, kdmcse, mcseo, simcse, visualcse  # noqa: F401  (register)
from mmcse.methods.base import Method, Term, build_heads, build_losses, build_method

__all__ = ["Method", "Term", "build_heads", "build_losses", "build_method"]
