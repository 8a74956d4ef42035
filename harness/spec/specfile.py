"""YAML specs (protocols, sweeps) shipped with bench under ``protocols/`` or given by path: one way to
find, parse and validate them, so every kind reports a bad file the same way (one paragraph naming the
field and value, exit code 2)."""

from __future__ import annotations

import codecs
import reprlib
import sys
from importlib import resources
from pathlib import Path
from typing import TypeVar, Union

import yaml
from pydantic import BaseModel, ValidationError

from ..errors import MISSING, BenchError, did_you_mean, not_a_file, read_file

if sys.version_info >= (3, 11):
    from importlib.resources.abc import Traversable
else:  # Python 3.10 has it only here (deprecated from 3.12 on)
    from importlib.abc import Traversable

Spec = TypeVar("Spec", bound=BaseModel)


def _folder(folder: str) -> Traversable:
    base = resources.files("bench_stability_gap.protocols")
    return base / folder if folder else base


def builtin_names(folder: str = "") -> list[str]:
    """Names of the YAML files shipped in ``protocols/<folder>``."""
    return sorted(p.name[:-5] for p in _folder(folder).iterdir() if p.name.endswith(".yaml"))


# a value as JSON holds it: a settings model's model_dump(mode="json"), a parsed JSON document
JSONValue = Union[str, int, float, bool, None, list["JSONValue"], dict[str, "JSONValue"]]  # noqa: UP007 - evaluated at import

MAX_SPEC_BYTES = 1 << 20      # a spec is a page of YAML; anything bigger is the wrong file
MAX_NODES = 10_000            # YAML nodes after expanding aliases: an alias bomb stops here
MAX_DEPTH = 32                # nesting; protocols use 4 levels
SHOWN_VALUE_CHARS = 80        # an offending value in an error message, truncated


def short_repr(value: object, limit: int = SHOWN_VALUE_CHARS) -> str:
    """A bounded repr for error messages: reprlib caps depth and items, so a huge or deeply nested
    value (an alias bomb) is never expanded; the text is then cut to ``limit`` characters."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, SHOWN_VALUE_CHARS, SHOWN_VALUE_CHARS


_UNION_TAGS = {"int", "float", "str", "bool", "none", "list", "dict", "tuple"}


def _field(loc: tuple) -> str:
    """The dotted field path of an error, without pydantic's union-branch tags (``constrained-int``,
    ``literal['per_sample']``): a field that accepts either of two kinds is still one field."""
    parts = [str(p) for p in loc if not (isinstance(p, str) and (not p.isidentifier() or p in _UNION_TAGS))]
    return ".".join(parts) or "(top level)"


def format_validation_error(err: ValidationError, what: str, origin: str) -> str:
    """One paragraph: each field once, what was wrong (alternatives joined by 'or'), and the offending
    value shown truncated (never an expanded alias tree)."""
    return f"Invalid {what} {origin}: {validation_problems(err)}."


def validation_problems(err: ValidationError) -> str:
    """Each field of ``err`` once with what was wrong and the value given (``format_validation_error``)."""
    fields: dict[str, tuple[list[str], str]] = {}
    for e in err.errors():
        msgs, value = fields.setdefault(_field(e["loc"]), ([], ""))
        msg = e["msg"].removeprefix("Value error, ")
        if msg not in msgs:
            msgs.append(msg)
        if not value and e["type"] != "missing" and not isinstance(e["input"], dict):
            fields[_field(e["loc"])] = (msgs, f" (got {short_repr(e['input'])})")
    return "; ".join(f"{field}: {' or '.join(msgs)}{value}" for field, (msgs, value) in fields.items())


def decode_spec(data: bytes, what: str, origin: str) -> str:
    """The text of a spec file, which must be UTF-8 (a BOM is allowed); anything else is named."""
    label = f"{what.capitalize()} {origin}"
    if len(data) > MAX_SPEC_BYTES:
        raise BenchError(f"{label} is {len(data)} bytes; "
                         f"a spec is at most {MAX_SPEC_BYTES} bytes. Is it the right file?")
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE, codecs.BOM_UTF32_LE, codecs.BOM_UTF32_BE)):
        raise BenchError(f"{label} is UTF-16/32 encoded; save it as UTF-8.")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise BenchError(f"{label} is not a UTF-8 text file (byte {data[exc.start]:#04x} at line {line}); "
                         f"save it as UTF-8.") from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise BenchError(f"{label} is not a text file (a NUL byte at line {line}).")
    return text


class _TooDeep(Exception):
    """Nesting past any spec's needs, found while the file is read (before it is fully scanned)."""


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys and bounds the document before building it: aliases may
    not expand past MAX_NODES nodes (they are shared in the node graph, so a 'billion laughs' file is
    small there and only explodes when validated or printed) and nesting may not pass MAX_DEPTH."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        # Stop far past the depth bound while reading (the bound itself is checked, with its line, on the
        # composed graph): the pure-Python scanner's cost per token grows with the flow nesting, so a file of
        # thousands of brackets would otherwise take seconds to reach Python's recursion limit.
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > 2 * MAX_DEPTH:
                raise _TooDeep
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: yaml.Node):
        _check_bounds(node)
        return super().construct_document(node)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *base` may be overridden by own keys
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeLoader's own error says so
                    break
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {short_repr(key)} (first at line {first})", key_node.start_mark)
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


MAX_INT_DIGITS = 100  # digits of an integer a spec may hold; Python refuses to convert more than 4,300


def _construct_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    """YAML's int, refused with its place when longer than any setting needs (instead of Python's
    int-conversion error, a traceback, past 4,300 digits)."""
    digits = sum(c.isalnum() for c in node.value)
    if digits > MAX_INT_DIGITS:
        raise yaml.constructor.ConstructorError(
            None, None, f"an integer of {digits:,} digits (no setting takes more than {MAX_INT_DIGITS})",
            node.start_mark)
    return yaml.SafeLoader.construct_yaml_int(loader, node)


_SpecLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)


def _check_bounds(root: yaml.Node) -> None:
    """Expanded size and depth of the node graph, each node visited once (memoised), so checking a
    bomb costs as little as the file it came from."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    active: set[int] = set()

    def visit(node: yaml.Node, level: int) -> None:
        if level > MAX_DEPTH:
            raise yaml.YAMLError(f"nesting deeper than {MAX_DEPTH} levels at line {node.start_mark.line + 1}")
        key = id(node)
        if key in active:
            raise yaml.YAMLError(f"a recursive alias at line {node.start_mark.line + 1}")
        if key in size and depth[key] + level <= MAX_DEPTH:
            return
        active.add(key)
        children = ([n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode)
                    else node.value if isinstance(node, yaml.SequenceNode) else [])
        for child in children:
            visit(child, level + 1)
        active.discard(key)
        size[key] = 1 + sum(size[id(c)] for c in children)
        depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
        if size[key] > MAX_NODES:
            raise yaml.YAMLError(f"more than {MAX_NODES} values, aliases expanded, from line "
                                 f"{node.start_mark.line + 1}; a spec needs far fewer")

    visit(root, 1)


def safe_yaml(text: str, what: str, origin: str) -> object:
    """Parse YAML with the bounds of ``_SpecLoader``; every problem is one BenchError naming the place."""
    label = f"{what.capitalize()} {origin}"
    try:
        return yaml.load(text, Loader=_SpecLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise BenchError(f"{label} is not valid YAML{where}: {exc.problem or exc.context}.") from None
    except yaml.YAMLError as exc:
        raise BenchError(f"{label} is not usable YAML: {exc}.") from None
    except (RecursionError, _TooDeep):
        raise BenchError(f"{label} is nested too deeply to read "
                         f"(more than {MAX_DEPTH} levels are never needed).") from None


def _mapping(text: str, what: str, origin: str) -> dict:
    data = safe_yaml(text, what, origin)
    if not isinstance(data, dict):
        raise BenchError(f"{what.capitalize()} {origin} must be a YAML mapping, got {type(data).__name__}.")
    return data


def merge_over(base: dict, override: dict) -> dict:
    """``override`` on top of ``base``: mappings merge key by key, anything else (lists included:
    a new ``stream_data`` replaces the old one whole) replaces the base's value."""
    out = dict(base)
    for key, value in override.items():
        out[key] = merge_over(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def resolve_extends(data: dict, what: str, origin: str, folder: str = "", seen: tuple[str, ...] = ()) -> dict:
    """``extends: NAME`` (a shipped spec) or ``extends: path.yaml`` (relative to the extending file):
    the base's fields with this file's on top, so a variant restates only what it changes."""
    if "extends" not in data:
        return data
    base_ref = data["extends"]
    if not isinstance(base_ref, str):
        raise BenchError(f"{what.capitalize()} {origin}: extends must name a shipped {what} or a YAML path, "
                         f"got {base_ref!r}.")
    if base_ref in seen or len(seen) > 8:
        raise BenchError(f"{what.capitalize()} {origin}: extends forms a cycle ({' -> '.join((*seen, base_ref))}).")
    path = Path(base_ref)
    if is_path(base_ref):
        if not path.is_absolute() and Path(origin).suffix in (".yaml", ".yml"):
            path = Path(origin).parent / path
        raw = read_file(path, f"{what.capitalize()} {origin}: the file it extends,")
        text, base_origin = decode_spec(raw, what, str(path)), str(path)
    else:
        names = builtin_names(folder)
        if base_ref not in names:
            raise did_you_mean(base_ref, names, what)
        text, base_origin = (_folder(folder) / f"{base_ref}.yaml").read_text(), base_ref
    base = resolve_extends(_mapping(text, what, base_origin), what, base_origin, folder, (*seen, base_ref))
    return merge_over(base, {k: v for k, v in data.items() if k != "extends"})


def parse_spec(model: type[Spec], text: str, what: str, origin: str, folder: str = "") -> Spec:
    """Validate YAML text as ``model`` (after ``extends``); every problem becomes a BenchError naming the field."""
    data = resolve_extends(_mapping(text, what, origin), what, origin, folder)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BenchError(format_validation_error(exc, what, origin)) from None


def is_path(name_or_path: str) -> bool:
    """A spec reference that names a file (a YAML suffix or a folder in it), not a built-in's name."""
    return Path(name_or_path).suffix in (".yaml", ".yml") or "/" in name_or_path


def load_spec(model: type[Spec], name_or_path: str, what: str, folder: str = "") -> Spec:
    """A built-in spec by name (``protocols/<folder>/NAME.yaml``), or a YAML file by path."""
    if not name_or_path.strip():  # as a path it would be the current folder
        raise BenchError(f"The {what} name is empty: give a built-in {what}'s name or a YAML file's path.")
    path = Path(name_or_path)
    if is_path(name_or_path) or not_a_file(path) != MISSING:
        raw = read_file(path, f"{what.capitalize()} file")
        return parse_spec(model, decode_spec(raw, what, str(path)), what, str(path), folder)
    names = builtin_names(folder)
    if name_or_path not in names:
        raise did_you_mean(name_or_path, names, what)
    return parse_spec(model, (_folder(folder) / f"{name_or_path}.yaml").read_text(), what, name_or_path, folder)
