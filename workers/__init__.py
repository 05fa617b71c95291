"""The worker: a plain class, wrapped as a Ray actor at the edge, that owns a share of the
queries and keeps their kNN exact (keyword-aware R-tree over query regions, batched search,
Redis writes). Not built yet: see the issue "The distributed runtime".
"""
