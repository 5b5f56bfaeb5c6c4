"""mohge: Mixture of Heterogeneous Grouped Experts (arXiv 2604.23108), a reproducible artifact.

``mohge.kernels`` lives in the top-level ``kernels/`` folder; the install maps it there (pyproject.toml's
package-dir), so an installed or editable ``mohge`` imports it from any directory without PYTHONPATH.
"""

__version__ = "0.1.0"
