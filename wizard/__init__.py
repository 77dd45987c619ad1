"""nnwizard: a guided troubleshooting wizard for PyTorch training runs."""

__version__ = "0.1.0"
