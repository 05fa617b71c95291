"""``knnmon serve``: the runtime as a long-running service that any Redis client talks to.

- :mod:`~knnmon.protocol` -- the stream protocol (entries, rejects, group);
- :mod:`~knnmon.coordinator.service.loop` -- the service loop (:class:`Service`);
- :mod:`~knnmon.coordinator.service.recovery` -- rebuilding the state from Redis after a restart;
- :mod:`~knnmon.coordinator.service.acks` -- acknowledging entries exactly once;
- :mod:`~knnmon.coordinator.service.status` -- what ``knnmon status`` shows;
- :mod:`~knnmon.coordinator.service.config` -- the ``knnmon serve`` settings.

Imports nothing itself (the light client imports the protocol module).
"""
