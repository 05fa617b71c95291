"""Many ``knn:ingest:objects`` entries parsed at once, as columns: what a service's recovery
reads back (the whole window's entries of the objects stream).

:func:`parse_objects` gives each entry exactly what :func:`~knnmon.protocol.parse_object` gives
it (the object, or the same :class:`~knnmon.errors.Rejected`), at a fraction of the cost: an
entry whose fields are plain -- every value ASCII within :data:`~knnmon.limits.MAX_FIELD_BYTES`,
an id of printable characters without blanks, numeric in-range coordinates other than (0, 0),
no ``t`` or an integer one, ``keywords`` (not raw ``text``), and times within the bounds -- is
parsed in passes over the whole batch; any other entry goes through ``parse_object`` itself,
which finds its reason.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from knnmon.arrays import segment_sums
from knnmon.errors import Rejected
from knnmon.limits import DEFAULT_LIMITS, INT64_MAX, INT64_MIN, MAX_FIELD_BYTES, MAX_ID_BYTES, Limits
from knnmon.protocol import parse_object

__all__ = ["OBJECT_SCHEMA", "ParsedObjects", "parse_objects"]

#: The objects a read of the objects stream applies, as a table.
OBJECT_SCHEMA = pa.schema([("id", pa.string()), ("lon", pa.float64()), ("lat", pa.float64()), ("t", pa.int64()),
                           ("keywords", pa.list_(pa.string()))])


@dataclass
class ParsedObjects:
    """``n`` entries parsed: row ``i`` is entry ``i``; ``ok[i]`` whether it parsed (else
    ``rejects`` holds why).

    Attributes
    ----------
    ok : ``(n,)`` bool
    ids : list of ``n`` str (``None`` where not ok)
    lon, lat : ``(n,)`` float64 degrees (where ok)
    t : ``(n,)`` int64 epoch ms (where ok)
    keywords : list of ``n`` tuples of str, sorted unique (``None`` where not ok)
    rejects : dict of int to Rejected
        The entries that did not parse, by row.
    """

    ok: np.ndarray
    ids: list
    lon: np.ndarray
    lat: np.ndarray
    t: np.ndarray
    keywords: list
    rejects: dict[int, Rejected]

    def table(self, rows: np.ndarray) -> pa.Table:
        """The objects of ``rows`` (``(m,)`` int64, rows where :attr:`ok`), in that order, as a
        table of :data:`OBJECT_SCHEMA`: the keywords as one list array over one values array."""
        rows = np.asarray(rows, dtype=np.int64)
        picked = [self.keywords[i] for i in rows.tolist()]
        offsets = np.zeros(len(picked) + 1, dtype=np.int32)
        np.cumsum(np.fromiter(map(len, picked), dtype=np.int32, count=len(picked)), out=offsets[1:])
        keywords = pa.ListArray.from_arrays(pa.array(offsets), pa.array(list(itertools.chain.from_iterable(picked)),
                                                                         pa.string()))
        return pa.table({"id": pa.array([self.ids[i] for i in rows.tolist()], pa.string()), "lon": self.lon[rows],
                         "lat": self.lat[rows], "t": self.t[rows], "keywords": keywords}, schema=OBJECT_SCHEMA)


def _number(raw) -> float:
    try:
        return float(raw)
    except (TypeError, ValueError, OverflowError):
        return math.nan


def _time(raw) -> int | None:
    """``t`` as parse_time reads it, ``None`` where the entry has none or it is not plain."""
    if raw is None or raw == "":
        return None
    try:
        ms = int(raw)
    except (TypeError, ValueError, OverflowError):
        return None
    return ms if INT64_MIN <= ms <= INT64_MAX else None


def _arrival(entry: tuple) -> int:
    """The entry id's time, -1 where it is not plain."""
    head = entry[0].partition("-")[0]
    return int(head) if head.isdigit() and len(head) < 16 else -1


def _plain_fields(fields: Sequence[Mapping]) -> np.ndarray:
    """``(n,)`` bool: every value of the entry is a str, ASCII, at most MAX_FIELD_BYTES long
    (so :func:`~knnmon.limits.check_fields` passes it)."""
    n = len(fields)
    values = [v for f in fields for v in f.values()]
    counts = np.fromiter(map(len, fields), dtype=np.int64, count=n)
    good = np.fromiter((v.__class__ is str and v.isascii() for v in values), dtype=bool, count=len(values))
    good &= np.fromiter(map(len, values), dtype=np.int64, count=len(values)) <= MAX_FIELD_BYTES
    return (segment_sums(~good, counts) == 0) & (counts > 0)


def parse_objects(entries: Sequence[tuple[str, Mapping[str, str]]], limits: Limits = DEFAULT_LIMITS, *,
                  clock_ms: int | None = None) -> ParsedObjects:
    """Parse ``entries`` (``(entry id, fields)`` as read from the stream) as
    :func:`~knnmon.protocol.parse_object` parses each with ``limits`` and ``clock_ms`` (module
    docstring); never raises for an entry."""
    n = len(entries)
    fields = [f for _, f in entries]
    ids = [f.get("id") for f in fields]
    plain = _plain_fields(fields)
    plain &= np.fromiter((x.__class__ is str and 0 < len(x) <= MAX_ID_BYTES and x.isprintable() and " " not in x
                          for x in ids), dtype=bool, count=n)  # (ASCII: a character is a byte)
    lon = np.fromiter((_number(f.get("lon")) for f in fields), dtype=np.float64, count=n)
    lat = np.fromiter((_number(f.get("lat")) for f in fields), dtype=np.float64, count=n)
    with np.errstate(invalid="ignore"):
        plain &= (np.abs(lon) <= 180) & (np.abs(lat) <= 90) & ~((lon == 0) & (lat == 0))  # (NaN fails)
    arrival = np.fromiter(map(_arrival, entries), dtype=np.int64, count=n)
    given = [_time(f.get("t")) for f in fields]
    has_t = np.fromiter((g is not None for g in given), dtype=bool, count=n)
    no_t = np.fromiter((f.get("t") in (None, "") for f in fields), dtype=bool, count=n)
    plain &= (has_t | no_t) & (arrival >= 0)
    t = arrival.copy()
    if has_t.any():
        t[has_t] = np.fromiter((g for g in given if g is not None), dtype=np.int64, count=int(has_t.sum()))
    bound = limits.max_future_ms
    if bound is not None:
        with np.errstate(over="ignore"):  # (a t near the int64 minimum wraps to "ahead": parsed one by one)
            plain &= t - arrival <= bound
        if clock_ms is not None:
            plain &= arrival - clock_ms <= bound
    keywords: list = [None] * n
    normal: dict[str, tuple[str, ...]] = {}  # each distinct text normalised once
    for i in np.flatnonzero(plain).tolist():
        raw = fields[i].get("keywords") or ""
        words = normal.get(raw)
        if words is None:
            words = normal[raw] = tuple(sorted(set(raw.lower().split())))
        if 0 < len(words) <= limits.max_keywords:
            keywords[i] = words
        else:
            plain[i] = False
    ok = plain.copy()
    out_ids = [x if p else None for x, p in zip(ids, plain.tolist())]
    rejects: dict[int, Rejected] = {}
    for i in np.flatnonzero(~plain).tolist():
        try:
            o = parse_object(entries[i][0], fields[i], limits, clock_ms=clock_ms)
        except Rejected as r:
            # A fresh copy, never raised: the raised one's traceback (and its context's) would hold
            # this frame, and with it the whole batch, in a cycle only the collector frees.
            rejects[i] = Rejected(r.reason, r.detail)
            continue
        ok[i] = True
        out_ids[i], lon[i], lat[i], t[i], keywords[i] = o.id, o.lon, o.lat, o.t, o.keywords
    return ParsedObjects(ok, out_ids, lon, lat, t, keywords, rejects)
