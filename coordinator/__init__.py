"""The coordinator: plans, routes object batches to the workers, serves, measures.

- :mod:`~knnmon.coordinator.cli` -- the ``knnmon`` command line, one module per verb;
- :mod:`~knnmon.coordinator.planning` -- load model + exact kNN radii + assignment -> a plan;
- :mod:`~knnmon.coordinator.runtime` -- the distributed runtime (worker pool, dispatch,
  registration, metrics, the object store);
- :mod:`~knnmon.coordinator.service` -- ``knnmon serve``: stream protocol, service loop,
  status;
- :mod:`~knnmon.coordinator.recovery` -- a restarted service, a lost worker, a Redis outage;
- :mod:`~knnmon.coordinator.bench` -- the paper's experiments, plots, the oracle check.

This package imports nothing itself, so :mod:`knnmon.client` can use the stream protocol
without loading the server's stack.
"""
