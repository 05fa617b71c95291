"""Re-balancing under drift: measure each worker's load, re-plan when it is uneven, move a
bounded number of queries between live workers at a batch boundary, exact throughout.

- :mod:`~knnmon.coordinator.runtime.rebalance_config` -- when and how much (``--rebalance``; a setting of the run);
- :mod:`.monitor` -- the workers' measured busy time over recent batches, and the trigger;
- :mod:`.planner` -- which queries move where, from each query's measured load
  (:mod:`knnmon.workers.query_load`), within a budget: the hottest set spread, in space order,
  over the least busy workers;
- :mod:`.migration` -- the move itself (export, adopt, routing, release);
- :mod:`.rebalancer` -- the three together, per batch, with a record of every re-plan.
"""
