"""Whether a sqlite tracking store already holds a complete record of a stored run, read with the standard
library's sqlite3 instead of MLflow.

Answering "this run is stored" is a file read; importing MLflow to confirm that its record is complete costs
seconds more than the rest of the answer. A complete record is one whose ``bench.synced`` tag is set (set
last, once everything is logged), or, for records logged before that tag existed, one that holds the
``bench.json`` tag and is not RUNNING: the rule ``tracking._whole`` applies through MLflow. The store is
opened read-only; anything unexpected (another backend, a schema this reading does not know, a locked or
missing file) answers "cannot tell", and the caller asks MLflow.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

SYNCED_TAG = "bench.synced"

_QUERY = """
SELECT r.status,
       MAX(CASE WHEN t2.key = ? THEN t2.value END),
       MAX(CASE WHEN t2.key = 'bench.json' THEN 1 ELSE 0 END)
FROM runs r
JOIN experiments e ON e.experiment_id = r.experiment_id
JOIN tags t ON t.run_uuid = r.run_uuid AND t.key = 'bench.run_id' AND t.value = ?
LEFT JOIN tags t2 ON t2.run_uuid = r.run_uuid
WHERE e.name = ? AND r.lifecycle_stage = 'active'
GROUP BY r.run_uuid
"""


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI; None for any other store."""
    return Path(uri.removeprefix("sqlite:///")) if uri.startswith("sqlite:///") else None


def has_whole_record(uri: str, protocol: str, run_id: str) -> bool | None:
    """True when the sqlite store at ``uri`` holds a complete record of run ``run_id`` (experiment
    ``bench/<protocol>``), False when it holds none, None when this cannot be read without MLflow."""
    path = sqlite_file(uri)
    if path is None or not path.is_file():
        return None
    try:
        with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=2) as db:
            rows = db.execute(_QUERY, (SYNCED_TAG, run_id, f"bench/{protocol}")).fetchall()
    except sqlite3.Error:
        return None
    return any(synced == "true" or (has_json and status != "RUNNING") for status, synced, has_json in rows)
