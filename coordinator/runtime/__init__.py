"""The distributed runtime (:class:`~knnmon.coordinator.runtime.runtime.Runtime`) and its parts:

- ``config`` -- :class:`RunConfig`, the ``knnmon run`` settings;
- ``preparation`` -- objects in stream order and the exact initial kNN;
- ``worker_pool`` -- the workers in process, the calls every pool shares, ``WorkerLostError``;
- ``ray_pool`` -- the workers as Ray actors;
- ``registration`` -- which worker holds which query; registration at run time;
- ``dispatch`` -- routing each batch to the workers that may need it, and collecting it;
- ``metrics`` -- update time, busy time, load imbalance; the run summary;
- ``object_store`` and ``object_index`` -- every object seen, and their exact kNN search.
"""
