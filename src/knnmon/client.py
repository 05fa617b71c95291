"""A Python client of ``knnmon serve``: plain Redis commands, nothing a client in another language
could not do (the README shows the same with ``redis-cli``). It speaks the stream protocol of
:mod:`knnmon.protocol` and imports only ``redis`` and knnmon's light core
(no numpy, Ray, Spark or pyarrow), so an application can use it without the server's stack.

>>> c = KnnClient("redis://127.0.0.1:6379/0")                       # doctest: +SKIP
>>> c.register("q1", -71.41, 41.82, ["coffee", "tea"], k=5)          # doctest: +SKIP
>>> c.publish([{"id": "o1", "lon": -71.4, "lat": 41.8, "keywords": "coffee"}])  # doctest: +SKIP
>>> c.wait()                                                         # doctest: +SKIP
[]
>>> c.results("q1")                                                  # doctest: +SKIP
[('o1', 2253.1...)]
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from knnmon.connection import connect
from knnmon.protocol import GROUP, entry_order, group_info
from knnmon.errors import KnnmonError
from knnmon.feed import parse_entry
from knnmon.keys import DEFAULT_NAMESPACE, Keys
from knnmon.limits import DEFAULT_LIMITS, Limits, check_keywords, parse_k, parse_point, parse_query_id
from knnmon.query import invalid_query
from knnmon.results import ResultReader

__all__ = ["KnnClient", "RejectedEntry", "ResultChange"]

log = logging.getLogger("knnmon.client")


class ResultChange(NamedTuple):
    """One query's result change: objects ``entered`` and ``left`` (ids), the change feed's
    ``version`` of it (the stream batches applied once it is: a query's changes come in
    increasing versions; a query registered before the stream starts has version 0), and the
    change feed's ``entry_id`` (the changes of one batch of one worker share one entry)."""

    entry_id: str
    qid: str
    entered: list[str]
    left: list[str]
    version: int


class RejectedEntry(NamedTuple):
    """An entry the service rejected (:meth:`KnnClient.wait`): its ``entry_id`` in ``stream``
    (``knn:ingest:objects`` or ``knn:ingest:queries``), ``reason`` (a key of
    :data:`~knnmon.errors.REJECT_REASONS`) and ``detail``."""

    entry_id: str
    stream: str
    reason: str
    detail: str


class KnnClient:
    """Register and unregister queries, publish objects, read results and changes.

    Parameters
    ----------
    url
        The Redis that ``knnmon serve`` uses.
    namespace
        Its key prefix (default ``knn``).
    limits
        The service's bounds (``limits.max_k``, ``limits.max_keywords``): :meth:`register` checks them
        before sending, as it checks the id and coordinates (:mod:`knnmon.limits`).

    Attributes
    ----------
    last_entry : str or None
        The stream entry id of the last operation this client added (for :meth:`wait`).
    """

    def __init__(self, url: str, namespace: str = DEFAULT_NAMESPACE, limits: Limits = DEFAULT_LIMITS) -> None:
        self.keys = Keys(namespace)
        self.limits = limits
        self.client = connect(url)
        self.last_entry: str | None = None
        self._added: dict[str, set[str]] = {}  # the entries added since the last wait: stream -> ids

    def _add(self, stream: str, ids: Sequence[str]) -> None:
        self._added.setdefault(stream, set()).update(ids)
        if ids:
            self.last_entry = ids[-1]

    def register(self, qid: str, lon: float, lat: float, keywords: Sequence[str] | str, k: int) -> str:
        """Register (or update) query ``qid``: the ``k`` nearest objects to ``(lon, lat)``
        (degrees) sharing a keyword; returns the stream entry id. Keywords are normalised by the
        service, which rejects a query left without one into ``knn:ingest:rejects``.

        Raises
        ------
        InvalidQueryError
            Before anything is sent: a bad id, coordinates or ``k``, or more keywords than
            ``limits.max_keywords``; ``reason`` says which.
        """
        with invalid_query(qid):
            qid = parse_query_id(qid)
            lon, lat = parse_point(lon, lat)
            k = parse_k(k, self.limits)
            if not isinstance(keywords, str):
                check_keywords(list(keywords), self.limits)
        words = keywords if isinstance(keywords, str) else " ".join(keywords)
        self._add(self.keys.ingest_queries, [self.client.xadd(self.keys.ingest_queries, {
            "op": "register", "id": qid, "lon": repr(lon), "lat": repr(lat), "keywords": words, "k": k})])
        return self.last_entry

    def unregister(self, qid: str) -> str:
        """Unregister query ``qid`` (its keys are deleted); returns the stream entry id."""
        self._add(self.keys.ingest_queries, [self.client.xadd(self.keys.ingest_queries, {"op": "unregister", "id": qid})])
        return self.last_entry

    def publish(self, objects: Iterable[Mapping[str, Any]], *, chunk: int = 1000) -> list[str]:
        """Publish objects: mappings with ``id``, ``lon``, ``lat``, optional ``t`` (epoch ms),
        and ``keywords`` (a list, or space-separated normalised terms) or ``text``. Returns the
        entry ids (one pipeline per ``chunk`` objects)."""
        ids: list[str] = []
        batch: list[dict[str, str | float | int]] = []

        def flush() -> None:
            pipe = self.client.pipeline(transaction=False)
            for fields in batch:
                pipe.xadd(self.keys.ingest_objects, fields)
            ids.extend(pipe.execute())
            batch.clear()

        for o in objects:
            fields = {k: (" ".join(v) if k == "keywords" and not isinstance(v, str) else v)
                      for k, v in o.items() if v is not None}
            batch.append(fields)
            if len(batch) >= chunk:
                flush()
        if batch:
            flush()
        self._add(self.keys.ingest_objects, ids)
        return ids

    def results(self, qid: str) -> list[tuple[str, float]]:
        """The current kNN of ``qid``: ``[(object id, distance m), ...]`` nearest first (empty if
        no such query or no match yet)."""
        return ResultReader(self.client, self.keys).result(qid)

    def query(self, qid: str) -> dict[str, str]:
        """The query's hash (``lon``, ``lat``, ``keywords``, ``k``, ``worker``); empty if not
        registered."""
        return ResultReader(self.client, self.keys).query_hash(qid)

    def changes(self, since: str = "0", count: int = 1000) -> list[ResultChange]:
        """Result changes after stream entry ``since`` (``"0"``: from the start), oldest first:
        the changes of whole feed entries, read until at least ``count`` changes (or the end);
        pass the last ``entry_id`` seen to get only newer ones.

        Every registration is a change with the whole initial result ``entered``, every
        unregister one with the whole result ``left``: applying them in order from the start
        reproduces every result's members. An entry this client cannot read (not written by
        knnmon) is skipped with a warning.
        """
        out: list[ResultChange] = []
        start = "(" + since if since != "0" else "-"
        while len(out) < count:
            rows = self.client.xrange(self.keys.changes, min=start, max="+", count=max(1, min(count - len(out), 1000)))
            for eid, f in rows:
                try:
                    out += [ResultChange(eid, *c) for c in parse_entry(f)]
                except (KeyError, ValueError):
                    log.warning("change feed entry %s is not one knnmon wrote; skipped", eid)
            if not rows:
                break
            start = "(" + rows[-1][0]
        return out

    def rejects(self, count: int = 1000, *, newest_first: bool = False) -> list[tuple[str, dict[str, str]]]:
        """Up to ``count`` rejected entries with their original fields and ``_reason``,
        ``_detail``, ``_stream``, ``_entry`` (``knn:ingest:rejects``, oldest first, or the newest
        first with ``newest_first``)."""
        if newest_first:
            return self.client.xrevrange(self.keys.ingest_rejects, count=count)
        return self.client.xrange(self.keys.ingest_rejects, count=count)

    def processed(self, entry_id: str, stream: str | None = None) -> bool:
        """Whether the service has applied and acknowledged entry ``entry_id`` of ``stream``
        (default: of either ingest stream; the two streams number their entries alike), or
        rejected it (a rejected entry leaves its stream).

        Raises
        ------
        KnnmonError
            No such entry in the ingest streams, and the service has not read past it.
        """
        passed = False
        for key in (stream,) if stream else (self.keys.ingest_objects, self.keys.ingest_queries):
            g = group_info(self.client, key)
            read_past = g is not None and entry_order(g["last-delivered-id"]) >= entry_order(entry_id)
            if self.client.xrange(key, min=entry_id, max=entry_id):
                return read_past and not self.client.xpending_range(key, GROUP, min=entry_id, max=entry_id, count=1)
            passed = passed or read_past
        if passed:  # read and gone: rejected (or, with a window, trimmed once applied)
            return True
        raise KnnmonError(f"no entry {entry_id} in the ingest streams")

    def wait(self, entry_id: str | None = None, timeout_s: float = 60.0) -> list[RejectedEntry]:
        """Block until the service has processed entry ``entry_id`` (:meth:`processed`), or by
        default every entry this client added since its last wait; returns those of them it
        rejected, with why (empty: all applied).

        Raises
        ------
        TimeoutError
            The service did not get there within ``timeout_s``.
        """
        if entry_id is not None:
            stream = next((key for key, ids in self._added.items() if entry_id in ids), None)
            waited = {stream: {entry_id}} if stream else {k: {entry_id} for k in (self.keys.ingest_objects,
                                                                                   self.keys.ingest_queries)}
        else:
            waited, self._added = self._added, {}
        if not waited:
            return []
        newest = {key: max(ids, key=entry_order) for key, ids in waited.items()}  # (read in order)
        deadline = time.monotonic() + timeout_s
        while not all(self.processed(eid, key if entry_id is None or len(waited) == 1 else None)
                      for key, eid in newest.items()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"entries up to {max(newest.values(), key=entry_order)} not processed within "
                                   f"{timeout_s} s (is `knnmon serve` running?)")
            time.sleep(0.02)
        # A reject is written when its entry is read, so after it: read the rejects from the
        # oldest waited entry's time on.
        out = []
        start = min((eid for ids in waited.values() for eid in ids), key=entry_order)
        while rows := self.client.xrange(self.keys.ingest_rejects, min=start, max="+", count=1000):
            out += [RejectedEntry(f["_entry"], f["_stream"], f.get("_reason", ""), f.get("_detail", ""))
                    for _, f in rows if f.get("_entry") in waited.get(f.get("_stream"), ())]
            start = "(" + rows[-1][0]
        return out

    def close(self) -> None:
        """Close the connection."""
        self.client.close()


