"""YAML specs (protocols, sweeps) shipped with bench under ``protocols/`` or given by path: one way to
find, parse and validate them, so every kind reports a bad file the same way (one paragraph naming the
field and value, exit code 2)."""

from __future__ import annotations

from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .errors import BenchError, did_you_mean

Spec = TypeVar("Spec", bound=BaseModel)


def _folder(folder: str) -> Traversable:
    base = resources.files("bench_stability_gap.protocols")
    return base / folder if folder else base


def builtin_names(folder: str = "") -> list[str]:
    """Names of the YAML files shipped in ``protocols/<folder>``."""
    return sorted(p.name[:-5] for p in _folder(folder).iterdir() if p.name.endswith(".yaml"))


def format_validation_error(err: ValidationError, what: str, origin: str) -> str:
    problems = []
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "(top level)"
        value = f" (got {e['input']!r})" if e["type"] != "missing" and not isinstance(e["input"], dict) else ""
        problems.append(f"{field}: {e['msg']}{value}")
    return f"Invalid {what} {origin}: " + "; ".join(problems) + "."


def parse_spec(model: type[Spec], text: str, what: str, origin: str) -> Spec:
    """Validate YAML text as ``model``; every problem becomes a BenchError naming the field."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise BenchError(f"{what.capitalize()} {origin} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise BenchError(f"{what.capitalize()} {origin} must be a YAML mapping, got {type(data).__name__}.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BenchError(format_validation_error(exc, what, origin)) from None


def load_spec(model: type[Spec], name_or_path: str, what: str, folder: str = "") -> Spec:
    """A built-in spec by name (``protocols/<folder>/NAME.yaml``), or a YAML file by path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise BenchError(f"{what.capitalize()} file {path} does not exist.")
        return parse_spec(model, path.read_text(), what, str(path))
    names = builtin_names(folder)
    if name_or_path not in names:
        raise did_you_mean(name_or_path, names, what)
    return parse_spec(model, (_folder(folder) / f"{name_or_path}.yaml").read_text(), what, name_or_path)
