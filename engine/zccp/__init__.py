"""ZCCP engine: the Python side of the Zero-Copy Context Pipeline."""

__version__ = "0.1.0"
