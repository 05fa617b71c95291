"""The worker: a plain class (:class:`~knnmon.workers.worker.KnnWorker`), wrapped as a Ray actor
at the edge (:mod:`~knnmon.workers.actor`), that owns a share of the queries and keeps their kNN
exact: a keyword-aware index over the queries' kNN regions (:mod:`~knnmon.workers.query_index`;
:mod:`~knnmon.workers.keyword_lists` for the single-process reference), a vectorised top-k merge,
and exactly-once result writes to Redis (:mod:`~knnmon.workers.result_writer`,
:mod:`~knnmon.workers.write_queue`).
"""
