"""bench's engine: protocols, data streams, models, the runner, metrics, results and tracking."""

__version__ = "0.1.0"
