"""Great-circle geometry on the WGS84 mean sphere (``docs/concepts.md``: haversine, meters)."""

from __future__ import annotations

import numpy as np

__all__ = ["EARTH_RADIUS_M", "cap_bbox", "chord2_bound", "haversine_m", "unit_vectors"]

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


def cap_bbox(lon, lat, radius_m) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Bounding box in degrees of the spherical cap of ``radius_m`` around each point.

    Exact on the sphere: the latitude range is ``lat -+ delta`` and the longitude half-width
    ``asin(sin(delta) / cos(lat))`` (``delta = r / R``), widened by ``1e-9`` relative + 1 mm
    against rounding. A cap over a pole or across the 180th meridian, or an infinite radius,
    gets the full longitude range ``[-180, 180]``.

    Parameters
    ----------
    lon, lat
        ``(m,)`` float64 degrees.
    radius_m
        ``(m,)`` float64 meters; ``inf`` allowed.

    Returns
    -------
    min_lon, min_lat, max_lon, max_lat
        ``(m,)`` float64 degrees; every point within ``radius_m`` lies inside.
    """
    lon = np.asarray(lon, dtype=np.float64)
    r = np.asarray(radius_m, dtype=np.float64)
    delta = np.where(np.isfinite(r), r * (1 + 1e-9) + 1e-3, np.inf) / EARTH_RADIUS_M
    phi = np.radians(np.asarray(lat, dtype=np.float64))
    lat0 = np.degrees(np.maximum(phi - delta, -np.pi / 2))
    lat1 = np.degrees(np.minimum(phi + delta, np.pi / 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        polar = (phi + delta >= np.pi / 2) | (phi - delta <= -np.pi / 2) | ~np.isfinite(delta)
        half = np.degrees(np.arcsin(np.clip(np.sin(np.minimum(delta, np.pi / 2)) / np.cos(phi), -1, 1)))
    full = polar | (half >= 180) | (lon - half < -180) | (lon + half > 180)
    lon0 = np.where(full, -180.0, lon - np.where(full, 0, half))
    lon1 = np.where(full, 180.0, lon + np.where(full, 0, half))
    return lon0, lat0, lon1, lat1


def unit_vectors(lon, lat) -> np.ndarray:
    """ECEF unit vectors of points: ``(m, 3)`` float64 from ``(m,)`` degrees."""
    lam, phi = np.radians(np.asarray(lon, dtype=np.float64)), np.radians(np.asarray(lat, dtype=np.float64))
    c = np.cos(phi)
    return np.column_stack([c * np.cos(lam), c * np.sin(lam), np.sin(phi)])


def chord2_bound(radius_m) -> np.ndarray:
    """An upper bound on the squared chord between the :func:`unit_vectors` of any two points
    whose :func:`haversine_m` distance is at most ``radius_m``.

    The chord of a great-circle distance ``r`` is ``2 sin(r / 2R)``, increasing in ``r`` up to
    half the circumference, so ``2 - 2 u.v <= chord2_bound(r)`` is a cheap pre-test for
    ``haversine_m <= r`` (a dot product, no trigonometry). It is a superset: widened by ``1e-9``
    relative plus ``1e-14`` absolute (the squared chord of about 0.6 m), more than the rounding
    error of ``2 - 2 u.v`` in float64 (a few ``1e-16``), so no true pair is dropped.

    Parameters
    ----------
    radius_m
        float64 meters, any shape; ``inf`` allowed.

    Returns
    -------
    numpy.ndarray
        float64, the same shape: the bound, ``inf`` where the radius reaches half the circumference.
    """
    half = np.asarray(radius_m, dtype=np.float64) / (2 * EARTH_RADIUS_M)
    with np.errstate(invalid="ignore"):
        chord = 2 * np.sin(np.minimum(half, np.pi / 2))
    return np.where(half >= np.pi / 2 * (1 - 1e-9), np.inf, chord * chord * (1 + 1e-9) + 1e-14)
