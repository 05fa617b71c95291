"""The coordinator: the ``knnmon`` command line (:mod:`knnmon.coordinator.cli`) and the demo;
later also planning, routing of object batches to workers, and runtime query registration.
"""
