"""The public Redis layout (``docs/concepts.md``, "Redis layout"): key names under a namespace."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BENCH_NAMESPACE", "Keys", "DEFAULT_NAMESPACE", "REPLANS_KEPT"]

DEFAULT_NAMESPACE = "knn"
#: ``knnmon bench``'s namespace, apart from a service's.
BENCH_NAMESPACE = "bench"
#: Re-plan records ``replans`` keeps.
REPLANS_KEPT = 1000


@dataclass(frozen=True)
class Keys:
    """Key names under ``namespace`` (default ``knn``).

    - ``result(qid)``: sorted set, member object id, score distance in meters;
    - ``query(qid)``: hash ``lon``, ``lat``, ``keywords`` (space separated), ``k``, ``worker``,
      ``objects`` (the name of the hash with its result's object details) (written at
      registration; a query moved by re-balancing gets its new ``worker`` and ``objects`` and
      ``moved_batch``, ``moved_from``, ``moved_replan``);
    - ``queries``: set of the registered query ids;
    - ``objects(worker)``: hash, object id -> ``lon lat t keywords`` (space separated) of every
      object in a result of that worker's queries (the query hash's ``worker``); in a Redis
      Cluster one per worker and master, ``objects(worker, tag)``, with the details of the
      results on that master (the query hash's ``objects`` names it);
    - ``changes``: stream, one entry per write of a worker: ``version`` and ``changes``, a line
      per changed result (:mod:`knnmon.feed`);
    - ``ingest_objects``, ``ingest_queries``: streams ``knnmon serve`` consumes (consumer group
      ``knnmon``); ``ingest_rejects``: the entries it rejected, with a reason;
    - ``serve_status``: hash the running service refreshes (``knnmon status``);
      ``serve_batches``: stream, one entry per processed batch (latency measurements);
      ``serve_checkpoint``: hash, the service's last checkpoint with a window (watermark, trim point);
      ``serve_alive``: string, the running service's heartbeat (epoch ms, every few seconds;
      its detached worker actors exit when it stops: :mod:`knnmon.workers.actor`);
      ``serve_snapshot``: hash, the live objects in columns, one field per checkpoint (its last
      entry id; :mod:`knnmon.coordinator.recovery.object_snapshot`);
      ``serve_settings``: hash, the settings the stored results are exact for (a restart with
      the same ones starts every worker from them: :mod:`knnmon.coordinator.recovery.resume`);
    - ``plan``: hash, the plan a run or service started with (``algorithm``, ``workers``,
      ``set:<i>`` as JSON; :mod:`knnmon.coordinator.runtime.plan_record`); a query hash's ``set``
      names its set;
    - ``replans``: list, newest first, one JSON record per re-plan of re-balancing (trigger,
      predicted gain, queries moved, seconds; the last :data:`REPLANS_KEPT`);
    - ``worker_batch(w)``: the last batch number worker ``w`` applied (idempotent writes); in a
      Redis Cluster one per master,
      ``worker_batch(w, tag)`` with a hash tag of a slot of that master
      (:mod:`knnmon.redis_cluster`).

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

    def objects(self, worker: int | str, tag: str | None = None) -> str:
        base = f"{self.namespace}:objects:{worker}"
        return base if tag is None else f"{base}{{{tag}}}"

    @property
    def queries(self) -> str:
        return f"{self.namespace}:queries"

    @property
    def changes(self) -> str:
        return f"{self.namespace}:changes"

    @property
    def ingest_objects(self) -> str:
        return f"{self.namespace}:ingest:objects"

    @property
    def ingest_queries(self) -> str:
        return f"{self.namespace}:ingest:queries"

    @property
    def ingest_rejects(self) -> str:
        return f"{self.namespace}:ingest:rejects"

    @property
    def serve_status(self) -> str:
        return f"{self.namespace}:serve:status"

    @property
    def serve_batches(self) -> str:
        return f"{self.namespace}:serve:batches"

    @property
    def plan(self) -> str:
        return f"{self.namespace}:plan"

    @property
    def replans(self) -> str:
        return f"{self.namespace}:replans"

    @property
    def serve_checkpoint(self) -> str:
        return f"{self.namespace}:serve:checkpoint"

    @property
    def serve_alive(self) -> str:
        return f"{self.namespace}:serve:alive"

    @property
    def serve_snapshot(self) -> str:
        return f"{self.namespace}:serve:snapshot"

    @property
    def serve_settings(self) -> str:
        return f"{self.namespace}:serve:settings"

    def worker_batch(self, worker: int | str, tag: str | None = None) -> str:
        base = f"{self.namespace}:worker:{worker}:batch"
        return base if tag is None else f"{base}{{{tag}}}"
