"""``knnmon serve``: the runtime as a long-running service that any Redis client talks to.

- :mod:`~knnmon.coordinator.service.loop` -- the service loop (:class:`Service`: read, apply,
  acknowledge; poison isolation; Redis outages ridden out), built with a
  :class:`~knnmon.coordinator.service.lifecycle.Lifecycle` and a
  :class:`~knnmon.coordinator.recovery.watch.Watch` (Redis restarted behind the retries, workers
  dead while idle);
- :mod:`~knnmon.coordinator.service.intake` -- reading the streams; a read of object entries
  parsed into objects and rejects (the stream protocol itself: :mod:`knnmon.protocol`);
- :mod:`~knnmon.coordinator.service.query_ops` -- register, update, unregister;
- :mod:`~knnmon.coordinator.service.ledger` -- acknowledgements, the batch log, checkpoints;
- :mod:`~knnmon.coordinator.service.lifecycle` and :mod:`~knnmon.coordinator.service.startup`
  -- start, status, stop (recovery itself: :mod:`knnmon.coordinator.recovery`);
- :mod:`~knnmon.coordinator.service.acks` -- acknowledging entries exactly once;
- :mod:`~knnmon.coordinator.service.batching`, :mod:`~knnmon.coordinator.service.latency` --
  when batches form, response times;
- :mod:`~knnmon.coordinator.service.status` -- what ``knnmon status`` shows;
- :mod:`~knnmon.coordinator.service.config` -- the ``knnmon serve`` settings.

Imports nothing itself.
"""
