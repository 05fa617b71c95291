"""The paper's experiments on the real runtime (``knnmon bench``):

- :mod:`~knnmon.coordinator.bench.runner` -- plan and run every combination, one report row each;
- :mod:`~knnmon.coordinator.bench.plots` -- the report in the shape of the paper's figures;
- :mod:`~knnmon.coordinator.bench.oracle_check` -- results in Redis against the brute-force oracle;
- :mod:`~knnmon.coordinator.bench.speed_probe` -- whether the machine ran at one speed.
"""
