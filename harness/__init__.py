"""bench's engine: protocols, data streams, models, the runner, metrics, results and tracking."""

from .numerics import apply_pins

# The CPU pins are read by the math libraries once, when torch loads: set them before anything imports it,
# so every x86-64 machine with AVX2 computes a run's numbers on the same code paths (harness.numerics).
apply_pins()

__version__ = "0.1.0"
