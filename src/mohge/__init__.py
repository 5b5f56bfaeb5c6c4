"""mohge: Mixture of Heterogeneous Grouped Experts (arXiv 2604.23108), a reproducible artifact."""

from pathlib import Path as _Path

__version__ = "0.1.0"

# `mohge.kernels` lives in the top-level kernels/ folder (setuptools package-dir). When mohge is imported
# from a source checkout (PYTHONPATH=src, as the workflow's conda environments and the GPU check do) rather
# than from an install, let the import system find it there too.
_checkout_kernels = _Path(__file__).resolve().parents[2] / "kernels"
if (_checkout_kernels / "__init__.py").is_file() and str(_checkout_kernels.parent) not in __path__:
    __path__.append(str(_checkout_kernels.parent))
