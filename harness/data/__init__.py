"""The data path: dataset sources, the stream (class order, sessions), input stores and trunk-feature caches."""

from .sources import ArraySplit, FileSplit, Split, expand_root, open_source

__all__ = ["ArraySplit", "FileSplit", "Split", "expand_root", "open_source"]
