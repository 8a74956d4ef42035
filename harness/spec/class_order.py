"""The order in which a CIL stream introduces its classes: drawn from the run seed, the paper's
published orders, or a file.

The paper's code reads its Places365 class orders from files (yousuf907/SGM,
``imagenet_files/places_LT_class_order_seed_{1,74,1444,1883,1993,2023}.txt``): the 365 category names,
``/`` written ``-``, sorted ignoring ``-`` and ``_``, then CPython's ``random.seed(s); random.shuffle``.
That rule reproduces all six files (tests/test_class_order.py holds their sha256). Its run script uses
1993 (Table 1); Table 3 averages the six. ``published`` gives run seed i the i-th of
``PUBLISHED_SEEDS``, so seed 0 is Table 1's order and seeds 0-5 are Table 3's six.

Class names are matched with ``/`` read as ``-``. A source whose classes have no names (``class_K``,
as a generated stand-in or Places365-LT without ``categories_places365.txt``) and that holds exactly
the 365 Places365 classes is read in Places365's id order (``places365_categories.txt``: the category
file's order, the names sorted as written with ``/``).
"""

from __future__ import annotations

import random
import re
from functools import cache
from importlib import resources
from pathlib import Path

from ..errors import BenchError

PUBLISHED_SEEDS: tuple[int, ...] = (1993, 1, 74, 1444, 1883, 2023)  # run seed i takes the i-th
UNNAMED = re.compile(r"^class_(\d+)$")


@cache
def places365_names() -> tuple[str, ...]:
    """The 365 Places365 category names in the dataset's id order, ``/`` written ``-``."""
    text = resources.files(__package__).joinpath("places365_categories.txt").read_text()
    return tuple(key(line) for line in text.split())


def key(name: str) -> str:
    """A class name as the published order files write it."""
    return name.replace("/", "-")


def published_order(seed: int) -> list[str]:
    """The published order of run seed ``seed`` (the paper's rule with ``PUBLISHED_SEEDS[seed]``)."""
    if not 0 <= seed < len(PUBLISHED_SEEDS):
        raise BenchError(
            f"class_order 'published' has {len(PUBLISHED_SEEDS)} orders (the paper's seeds "
            f"{', '.join(map(str, PUBLISHED_SEEDS))}, run seeds 0-{len(PUBLISHED_SEEDS) - 1}); seed {seed} has "
            f"none. Run a seed in that range, or set class_order: seeded for orders drawn from the seed.")
    names = sorted(places365_names(), key=lambda n: n.replace("-", "").replace("_", ""))
    # random.seed(s); random.shuffle(names) in the code: the same draw, on an instance of its own so that
    # Python's global random state is left as it was
    random.Random(PUBLISHED_SEEDS[seed]).shuffle(names)
    return names


def file_path(value: str) -> Path:
    """The path of a ``file:PATH`` order (``~`` expanded)."""
    return Path(value.removeprefix("file:")).expanduser()


def read_order_file(value: str) -> list[str]:
    """The names of a ``file:PATH`` order, one per line (blank lines skipped); a repeated name or an
    unreadable file is an error naming ``class_order``."""
    path = file_path(value)
    try:
        names = [key(line.strip()) for line in path.read_text().splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"class_order {value!r}: {path} cannot be read ({exc})") from None
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"class_order {value!r}: {path} names {', '.join(repeated[:5])} more than once")
    if not names:
        raise ValueError(f"class_order {value!r}: {path} names no class")
    return names


def stream_keys(sources: list[list[str]]) -> list[str]:
    """The names an order is matched against, one per stream class (the sources concatenated): a
    source of 365 unnamed classes is read as Places365 in its id order."""
    out: list[str] = []
    for names in sources:
        ids = [UNNAMED.match(n) for n in names]
        if len(names) == len(places365_names()) and all(m and int(m[1]) == k for k, m in enumerate(ids)):
            out.extend(places365_names())
        else:
            out.extend(key(n) for n in names)
    return out


def ordered_classes(value: str, seed: int, sources: list[list[str]]) -> list[int]:
    """Stream class indices (0-based over the stream sources) in the order ``value`` gives, for a
    ``published`` or ``file:`` order; it must name every stream class once and no other."""
    names = published_order(seed) if value == "published" else read_order_file(value)
    keys = stream_keys(sources)
    where = {k: i for i, k in enumerate(keys)}
    lacking = [n for n in names if n not in where]
    missing = [k for k in keys if k not in set(names)]
    if lacking or missing:
        what = "the published Places365 order" if value == "published" else str(file_path(value))
        parts = [f"names {len(lacking)} class(es) the stream data lacks ({', '.join(lacking[:5])})"] if lacking else []
        parts += [f"misses {len(missing)} of its classes ({', '.join(missing[:5])})"] if missing else []
        raise BenchError(f"class_order {value!r}: {what} {' and '.join(parts)}. An order must name every class "
                         f"of the stream sources once (with '/' written '-'); nothing has been computed.")
    return [where[n] for n in names]
