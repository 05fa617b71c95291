"""Query-to-worker assignment (pure, deterministic numpy; no Ray, Redis or Spark).

Will hold the load model of Tsuruoka et al. (2019), §4.2, over ``stats.parquet``; the proposed
space-vs-keyword partitioning (Algorithm 1) and greedy assignment (Algorithm 2); the
keyword, space and random baselines; and the routing table. Not built yet: see the issue
"The query-assignment algorithm".
"""
