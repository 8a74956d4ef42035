"""The paper-distance block of a protocol's section: the paper's setting beside the protocol's, axis by axis
(``harness/spec/paper.py`` holds the paper's values), so a reader of a ranking sees what it can predict."""

from __future__ import annotations

from typing import Any

from ..harness.errors import BenchError
from ..harness.spec.paper import distance
from ..harness.spec.protocol import load_protocol
from ..methods.sgm.settings_view import sgm_settings


def paper_distance(name: str) -> dict[str, Any] | None:
    """The block for the protocol called ``name`` as it is installed now, or None where no protocol of that
    name can be loaded (a board of a user's protocol file that is not on the search path)."""
    try:
        protocol = load_protocol(name)
    except BenchError:
        return None
    setup, axes = distance(protocol, sgm_settings(protocol))
    return {"setup": setup, "axes": axes, "hash": protocol.spec_hash}
