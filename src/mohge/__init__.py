"""mohge: Mixture of Heterogeneous Grouped Experts (arXiv 2604.23108), a reproducible artifact."""

__version__ = "0.1.0"
