"""Hypothesis' profiles for this suite, and the example counts of tests that set their own.

``dev`` and ``ci`` run each test's own count (60 unless the test says otherwise), ``ci``
derandomized so that a run repeats the last; ``quick``, for the edit-test loop, a sixth
of it. A test that sets its count writes ``max_examples=scaled(n)``: ``n`` under ``dev``
and ``ci``, a sixth of it (at least 3) under ``quick``. A test's module is imported after
the profile is chosen (``--hypothesis-profile``), so the count is the chosen profile's.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

FULL_EXAMPLES = 60

settings.register_profile(
    "dev", max_examples=FULL_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("ci", parent=settings.get_profile("dev"), derandomize=True)
settings.register_profile("quick", parent=settings.get_profile("dev"), max_examples=FULL_EXAMPLES // 6)


def scaled(count: int) -> int:
    """``count`` examples under a full profile, proportionally fewer under ``quick``."""
    return max(min(count, 3), count * settings.default.max_examples // FULL_EXAMPLES)
