"""GDumb (Prabhu et al., ECCV 2020) as the paper uses it (Harun & Kanan 2024, Sec. 5.2, appendix).

GDumb's memory is class-balanced: once the storage cap is reached, a new sample evicts a random
sample of the class that holds the most (and is dropped when its own class is that class). The
original GDumb retrains from scratch on the memory alone; the paper instead runs it as a rehearsal
method "under identical configurations" to DERpp and SGM, so here each update trains on the
session's samples plus samples drawn from GDumb's class-balanced memory, with the standard step
(every modifier, +sgm included, composes with it).

Budget: the storage cap, the batch composition and the update count are the protocol's; only the
eviction rule is GDumb's (``memory_policy``). Under a protocol with unlimited storage nothing is ever
evicted and GDumb trains exactly like ``vanilla``.
"""

from __future__ import annotations

from .base import StandardMethod


class GDumb(StandardMethod):
    name = "gdumb"
    summary = "Rehearsal from a class-balanced memory (evicts from the largest class) under the protocol's cap."
    memory_policy = "class_balanced"
