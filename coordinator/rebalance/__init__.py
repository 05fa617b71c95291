"""Re-balancing under drift: measure each worker's load, re-plan when it is uneven, move a
bounded number of queries between live workers at a batch boundary, exact throughout.

- :mod:`.config` -- when and how much (``--rebalance``);
- :mod:`.monitor` -- the workers' measured busy time over recent batches, and the trigger;
- :mod:`.planner` -- which queries move where: whole query sets of the plan where possible,
  from each query's measured load (:mod:`knnmon.workers.query_load`), within a budget;
- :mod:`.migration` -- the move itself (export, adopt, routing, release);
- :mod:`.rebalancer` -- the three together, per batch, with a record of every re-plan.
"""
