"""Datasets: sources (one dataset as train/test splits) and, built on them, the stream."""

from ..data.sources import ArraySplit, FileSplit, Split, expand_root, open_source

__all__ = ["ArraySplit", "FileSplit", "Split", "expand_root", "open_source"]
