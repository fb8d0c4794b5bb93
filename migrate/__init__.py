"""distify: turn single-GPU PyTorch training scripts into distributed ones.

This package is imported by migrated training scripts (``from distify import runtime``), so it
must stay import-light: nothing here may import libcst, typer, rich or torch.
"""

__version__ = "0.1.0"
