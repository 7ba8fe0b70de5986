"""Where the datasets measured by others lie (next to the checkout, not in CI's clone), and
the marker for tests that need the benchmark hub's convolution files."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets"
HUB_T4 = SHARED / "convolution_A100.t4.json.gz"
HUB_CACHE = SHARED / "convolution_A100.kt-cache.json.gz"
needs_hub = pytest.mark.skipif(
    not (HUB_T4.exists() and HUB_CACHE.exists()), reason="benchmark hub files not present"
)
