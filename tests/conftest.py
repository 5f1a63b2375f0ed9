"""Shared pytest settings for the attn_np tests.

Hypothesis runs a modest, derandomised number of examples with no per-example deadline: gradient
checks by finite differences are slow by design, and CI must give the same verdict twice in a row.
Set ``HYPOTHESIS_PROFILE=thorough`` to explore more shapes locally.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "attn_np",
    max_examples=60,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "thorough",
    max_examples=500,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "attn_np"))
