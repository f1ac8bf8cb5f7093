"""The benchmark entry points still run against the current code (figures are not asserted)."""
from __future__ import annotations

import pytest

from bench.__main__ import bench_cold_start, bench_image_batch, bench_tiny_round_trip


@pytest.mark.slow
def test_bench_lines_run(image_python):
    assert "overhead" in bench_tiny_round_trip()
    line = bench_image_batch()
    assert "ratio" in line and "child-side p50 ms: receive" in line
    assert "difference" in bench_cold_start("image")
