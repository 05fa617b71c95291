"""Recovery: everything knnmon does when a part fails, in one room. Nothing acknowledged is lost
or applied twice; every result stays exact (docs/serve.md "Faults").

Its three sides, by what failed:

1. **The service** (a restart, SIGKILL, a fault it could not ride out): the state rebuilt from
   Redis and the ingest streams.
   - :mod:`~knnmon.coordinator.recovery.rebuild` -- queries, objects and pending entries read
     back; the results searched and compared (a full recovery);
   - :mod:`~knnmon.coordinator.recovery.resume`, :mod:`~knnmon.coordinator.recovery.stored_start`,
     :mod:`~knnmon.coordinator.recovery.kept_start` -- whether and how the workers start from the
     results Redis holds, or are kept as they are (no search);
   - :mod:`~knnmon.coordinator.recovery.object_log`, :mod:`~knnmon.coordinator.recovery.object_snapshot`,
     :mod:`~knnmon.coordinator.recovery.checkpoint` -- the objects stream read back, the live
     objects' snapshot beside it, and with a window the checkpoints that trim it.
2. **A worker** (its Ray actor died): revived in place, the run goes on.
   - :mod:`~knnmon.coordinator.recovery.reviver` -- when and whether (the runtime's
     :class:`~knnmon.coordinator.runtime.runtime.Runtime` is given :class:`Reviver`);
   - :mod:`~knnmon.coordinator.recovery.revival`, :mod:`~knnmon.coordinator.recovery.revival_repair`
     -- the worker loaded from Redis and the batches in flight sent again;
   - :mod:`~knnmon.coordinator.recovery.liveness` -- which actors live (``/readyz``).
   The worker's own part runs in the worker's process: its last write's marker
   (:meth:`~knnmon.workers.result_writer.ResultWriter.last_write`) and its kept state
   (:mod:`knnmon.workers.kept_state`).
3. **Redis** (a restart, a network cut): ridden out without a rebuild when it kept every write.
   - :mod:`~knnmon.coordinator.recovery.outage` -- the check, waiting for Redis, and which
     failures are the infrastructure's rather than an entry's;
   - :mod:`~knnmon.coordinator.recovery.watch` -- the service loop's side: an outage ridden out,
     a restart the retries hid, a worker dead while idle.

Imports flow into it from :mod:`knnmon.coordinator.service` only; it uses
:mod:`knnmon.coordinator.runtime` and never the reverse. Imports nothing itself.
"""
