"""The statistics grid: ``n x n`` equal cells over a longitude/latitude bounding box.

The grid of ``stats.parquet`` and of the load model (``docs/concepts.md``, "The load model"). Cells are
equal in degrees, not in area. Cell ``(cx, cy)`` covers longitudes
``[min_lon + cx * w, min_lon + (cx + 1) * w)`` and latitudes
``[min_lat + cy * h, min_lat + (cy + 1) * h)`` with ``w = (max_lon - min_lon) / n`` and
``h = (max_lat - min_lat) / n``; the last row and column also hold their upper edge, and points
outside the box are clamped into the nearest edge cell. The flat cell id is ``cy * n + cx``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from knnmon.errors import InvalidArgumentError

__all__ = ["DEFAULT_GRID", "Grid"]

#: Cells per side of the ingest's statistics grid (``knnmon ingest --grid``).
DEFAULT_GRID = 128

#: Smallest extent of a grid side in degrees, so a one-point data set still has a grid.
MIN_EXTENT_DEG = 1e-6


@dataclass(frozen=True)
class Grid:
    """An ``n x n`` grid over ``[min_lon, max_lon] x [min_lat, max_lat]`` (WGS84 degrees).

    Raises
    ------
    InvalidArgumentError
        If ``n < 1``, a bound is not finite, or a maximum is below its minimum.

    Examples
    --------
    >>> g = Grid(-10.0, 0.0, 10.0, 20.0, n=4)
    >>> g.cell_of(np.array([-10.0, 9.99, 10.0]), np.array([0.0, 19.0, 25.0])).tolist()
    [0, 15, 15]
    """

    min_lon: float
    min_lat: float
    max_lon: float
    max_lat: float
    n: int

    def __post_init__(self) -> None:
        if int(self.n) != self.n or self.n < 1:
            raise InvalidArgumentError(f"grid size n must be an integer >= 1; got {self.n!r}")
        bounds = (self.min_lon, self.min_lat, self.max_lon, self.max_lat)
        if not all(np.isfinite(b) for b in bounds):
            raise InvalidArgumentError(f"grid bounds must be finite degrees; got {bounds}")
        if self.max_lon < self.min_lon or self.max_lat < self.min_lat:
            raise InvalidArgumentError(f"grid maxima must not be below minima; got {bounds}")

    @classmethod
    def covering(cls, min_lon: float, min_lat: float, max_lon: float, max_lat: float, n: int) -> Grid:
        """The grid over a data bounding box, widened to at least ``MIN_EXTENT_DEG`` per side."""
        if max_lon - min_lon < MIN_EXTENT_DEG:
            max_lon = min_lon + MIN_EXTENT_DEG
        if max_lat - min_lat < MIN_EXTENT_DEG:
            max_lat = min_lat + MIN_EXTENT_DEG
        return cls(float(min_lon), float(min_lat), float(max_lon), float(max_lat), int(n))

    @property
    def cell_width_deg(self) -> float:
        """Width ``w`` of a cell in degrees of longitude."""
        return (self.max_lon - self.min_lon) / self.n

    @property
    def cell_height_deg(self) -> float:
        """Height ``h`` of a cell in degrees of latitude."""
        return (self.max_lat - self.min_lat) / self.n

    @property
    def n_cells(self) -> int:
        """Number of cells, ``n * n``."""
        return self.n * self.n

    def cell_xy(self, lon: np.ndarray, lat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Column and row of each point.

        Parameters
        ----------
        lon, lat
            ``(m,)`` float64 degrees.

        Returns
        -------
        cx, cy
            ``(m,)`` int32 in ``[0, n)``; points outside the box are clamped to the edge cells.
        """
        lon = np.asarray(lon, dtype=np.float64)
        lat = np.asarray(lat, dtype=np.float64)
        cx = np.floor((lon - self.min_lon) / self.cell_width_deg)
        cy = np.floor((lat - self.min_lat) / self.cell_height_deg)
        top = self.n - 1
        return (np.clip(cx, 0, top).astype(np.int32), np.clip(cy, 0, top).astype(np.int32))

    def cell_of(self, lon: np.ndarray, lat: np.ndarray) -> np.ndarray:
        """Flat cell id ``cy * n + cx`` of each point: ``(m,)`` int32 (see :meth:`cell_xy`)."""
        cx, cy = self.cell_xy(lon, lat)
        return cy * np.int32(self.n) + cx

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description, as stored under ``grid`` in ``manifest.json``."""
        d: dict[str, Any] = asdict(self)
        d["cell_width_deg"] = self.cell_width_deg
        d["cell_height_deg"] = self.cell_height_deg
        d["cell_id"] = "cy * n + cx"
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Grid:
        """Inverse of :meth:`to_dict` (extra keys are ignored)."""
        return cls(float(d["min_lon"]), float(d["min_lat"]), float(d["max_lon"]), float(d["max_lat"]), int(d["n"]))
