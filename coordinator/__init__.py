"""The coordinator: the ``knnmon`` command line (:mod:`knnmon.coordinator.cli`), planning and
routing of object batches to the workers (:mod:`~knnmon.coordinator.runtime`), the service that
consumes Redis streams (:mod:`~knnmon.coordinator.serve`), the benchmarks and the demo.
"""
