"""When each request is submitted: the arrival schedule of a run."""

from __future__ import annotations

import math
import random


def arrival_offsets(
    n: int,
    request_rate: float = math.inf,
    *,
    submit_interval_ms: float | None = None,
    burstiness: float = 1.0,
    seed: int = 0,
) -> list[float]:
    """Submit times of n requests in seconds after the start, non-decreasing, first 0.

    A fixed interval gives i * interval; an infinite rate gives all zeros; a finite rate gives
    gaps drawn from a gamma distribution with mean 1/rate and shape `burstiness` (1 = the
    exponential gaps of a Poisson process), seeded."""
    if n <= 0:
        return []
    if submit_interval_ms is not None:
        if submit_interval_ms < 0:
            raise ValueError("submit interval must be >= 0")
        return [i * submit_interval_ms / 1000.0 for i in range(n)]
    if request_rate <= 0:
        raise ValueError("request rate must be > 0")
    if math.isinf(request_rate):
        return [0.0] * n
    if burstiness <= 0:
        raise ValueError("burstiness must be > 0")
    rng = random.Random(seed)
    theta = 1.0 / (request_rate * burstiness)  # gamma scale: mean gap = shape*scale = 1/rate
    out, t = [0.0], 0.0
    for _ in range(n - 1):
        t += rng.gammavariate(burstiness, theta)
        out.append(t)
    return out
