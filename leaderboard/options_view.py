"""A run's options as its page shows them: a nested mapping as a small table, a list of records (one per
session) as one table with a column per field, byte counts in GB (MB below a tenth of one), fractions
rounded to four significant digits, so nothing on the page reads as a Python repr or a raw byte count.
The exact value stays in each cell's title, and the result JSON the page links holds everything."""

from __future__ import annotations

from typing import Any

SIZE_SUFFIXES = ("_bytes", "_budget")  # ram_bytes, disk_budget, ...: byte counts in the data-path plan


def is_size(key: str) -> bool:
    return key.endswith(SIZE_SUFFIXES)


def size_text(n: float) -> str:
    """Bytes in decimal GB (MB below 0.1 GB, where GB would read 0.00)."""
    if abs(n) >= 1e8:
        return f"{n / 1e9:,.2f} GB"
    return f"{n / 1e6:,.2f} MB"


def scalar_text(key: str, value: Any) -> dict:
    """One value as text, with its exact form as the title where the text rounds it."""
    if value is None:
        return {"text": "–", "title": None}
    if isinstance(value, bool):
        return {"text": "yes" if value else "no", "title": None}
    if isinstance(value, (int, float)) and is_size(key):
        return {"text": size_text(value), "title": f"{value:,} bytes"}
    if isinstance(value, int):
        return {"text": f"{value:,}", "title": None}
    if isinstance(value, float):
        text = f"{value:,.0f}" if value.is_integer() and abs(value) < 1e15 else f"{value:.4g}"
        return {"text": text, "title": None if text == repr(value) else repr(value)}
    return {"text": str(value), "title": None}


def _flat(record: dict, prefix: str = "") -> dict[str, Any]:
    """A record with nested mappings spelled out (``shares: new``), one level of columns."""
    out: dict[str, Any] = {}
    for k, v in record.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flat(v, f"{name}: "))
        else:
            out[name] = v
    return out


def _grid(records: list[dict], index: list[str] | None = None) -> dict:
    """Records as one table: a column per field (in first-seen order), a row per record."""
    flat = [_flat(r) for r in records]
    columns: list[str] = []
    for r in flat:
        columns += [k for k in r if k not in columns]
    rows = [[scalar_text(c.rsplit(": ", 1)[-1], r.get(c)) for c in columns] for r in flat]
    return {"kind": "grid", "columns": columns, "rows": rows, "index": index}


def _records(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def _flat_record(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and not any(isinstance(x, (dict, list)) for x in value.values())


def _mapping_of_records(value: dict) -> bool:
    """``{test: {mode, samples, ...}, train: {...}}``: records by name, one table with a row each."""
    return len(value) > 1 and all(_flat_record(v) for v in value.values())


def _map_rows(value: dict) -> list[tuple[str, dict]]:
    """A mapping's rows; its flat records (the data path's ``test`` and ``train`` plans) share one table, a
    row each, under their names joined, in the place of the first."""
    named = [k for k, v in value.items() if _flat_record(v)]
    rows: list[tuple[str, dict]] = []
    for k, v in value.items():
        if len(named) > 1 and k in named:
            if k == named[0]:
                names = [str(n) for n in named]
                rows.append((" / ".join(names), _grid([value[n] for n in named], index=names)))
        else:
            rows.append((str(k), option_node(str(k), v)))
    return rows


def option_node(key: str, value: Any) -> dict:
    """The view of one option: ``text`` (a scalar or a list of scalars), ``map`` (rows of key and node) or
    ``grid`` (columns and rows of texts, ``index`` naming the rows where the records had names)."""
    if isinstance(value, dict):
        if _mapping_of_records(value):
            return _grid(list(value.values()), index=[str(k) for k in value])
        return {"kind": "map", "rows": _map_rows(value)}
    if _records(value):
        return _grid(value)
    if isinstance(value, (list, tuple)):
        if not value:
            return {"kind": "text", "text": "none", "title": None}
        parts = [scalar_text(key, v)["text"] for v in value]
        return {"kind": "text", "text": (" × " if key.endswith("shape") else ", ").join(parts), "title": None}
    return {"kind": "text", **scalar_text(key, value)}
