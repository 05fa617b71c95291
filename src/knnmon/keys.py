"""The public Redis layout (``SPEC.md``, "Redis layout"): key names under a namespace."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Keys", "DEFAULT_NAMESPACE"]

DEFAULT_NAMESPACE = "knn"


@dataclass(frozen=True)
class Keys:
    """Key names under ``namespace`` (default ``knn``).

    - ``result(qid)``: sorted set, member object id, score distance in meters;
    - ``query(qid)``: hash ``lon``, ``lat``, ``keywords`` (space separated), ``k``, ``worker``,
      ``version`` (at registration; later versions are in ``changes``);
    - ``object(oid)``: hash ``lon``, ``lat``, ``t``, ``keywords``, ``refs`` (results holding it);
    - ``changes``: stream of ``qid``, ``entered``, ``left``, ``version`` per changed result;
    - ``ingest_objects``, ``ingest_queries``: streams ``knnmon serve`` consumes;
    - ``worker_batch(w)``: the last batch number worker ``w`` applied (idempotent writes).

    Examples
    --------
    >>> Keys().result("42")
    'knn:result:42'
    """

    namespace: str = DEFAULT_NAMESPACE

    def result(self, qid: str) -> str:
        return f"{self.namespace}:result:{qid}"

    def query(self, qid: str) -> str:
        return f"{self.namespace}:query:{qid}"

    def object(self, oid: str) -> str:
        return f"{self.namespace}:object:{oid}"

    @property
    def changes(self) -> str:
        return f"{self.namespace}:changes"

    @property
    def ingest_objects(self) -> str:
        return f"{self.namespace}:ingest:objects"

    @property
    def ingest_queries(self) -> str:
        return f"{self.namespace}:ingest:queries"

    def worker_batch(self, worker: int) -> str:
        return f"{self.namespace}:worker:{worker}:batch"
