"""A helper module of the cheating plugin: a place out of the method's class and module to keep data in."""

from __future__ import annotations

KEPT: list = []
