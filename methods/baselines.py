"""The paper's reference learners on the standard step: lower bound, output layer only, rehearsal."""

from __future__ import annotations

from .base import StandardMethod
from .configs import OutputOnlyConfig


class Vanilla(StandardMethod):
    name = "vanilla"
    summary = "Rehearsal: half of each batch from the session, half from memory; body and head train."


class Finetune(StandardMethod):
    name = "finetune"
    summary = "Naive fine-tuning on the current session only (no rehearsal): the lower bound."
    rehearsal = False


class OutputOnly(StandardMethod):
    name = "output_only"
    summary = "Rehearsal that trains only the output layer; every hidden layer stays frozen."
    Config = OutputOnlyConfig
