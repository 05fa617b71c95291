"""Great-circle geometry on the WGS84 mean sphere (``SPEC.md``: haversine, meters)."""

from __future__ import annotations

import numpy as np

__all__ = ["EARTH_RADIUS_M", "haversine_m"]

#: Mean Earth radius in meters (IUGG), the radius every distance in knnmon uses.
EARTH_RADIUS_M = 6_371_008.8


def haversine_m(lon1, lat1, lon2, lat2) -> np.ndarray:
    """Great-circle distance in meters between points given in degrees (broadcasting).

    Parameters
    ----------
    lon1, lat1, lon2, lat2
        float64 degrees, scalars or arrays of broadcastable shapes.

    Returns
    -------
    numpy.ndarray
        float64 meters, the broadcast shape; exact at the antimeridian and the poles.

    Examples
    --------
    >>> round(float(haversine_m(179.5, 0.0, -179.5, 0.0)))  # across the 180th meridian
    111195
    """
    lon1, lat1, lon2, lat2 = (np.radians(np.asarray(x, dtype=np.float64)) for x in (lon1, lat1, lon2, lat2))
    a = np.sin((lat2 - lat1) / 2) ** 2 + np.cos(lat1) * np.cos(lat2) * np.sin((lon2 - lon1) / 2) ** 2
    return 2 * EARTH_RADIUS_M * np.arcsin(np.sqrt(np.clip(a, 0.0, 1.0)))
