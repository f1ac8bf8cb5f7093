"""The benchmark entry points still run against the current code (figures are not asserted)."""

from __future__ import annotations

import pytest

from bench.__main__ import bench_cold_start, bench_jpeg_batch, bench_shutdown, bench_tiny_round_trip, bench_transport
from tests.conftest import env_python


@pytest.mark.slow
def test_bench_lines_run(image_python):
    assert "overhead" in bench_tiny_round_trip()
    transport = bench_transport()
    assert "managed, shared" in transport and "managed, in-band" in transport and "JPEG" in transport
    assert "child-side p50 ms: receive" in transport
    assert "ratio" in bench_jpeg_batch()
    assert "difference" in bench_cold_start("image")
    assert "past the deadline" in bench_shutdown()


@pytest.mark.slow
def test_bench_panel_line_runs(math_python):
    from bench import panel

    assert "ratio" in panel.main_line(rounds=1)


@pytest.mark.slow
def test_bench_panel_server_line_runs(math_python, image_python):
    from bench import panel_server

    assert "overhead" in panel_server.main_line(rounds=1)


@pytest.mark.slow
def test_bench_overlap_line_runs(math_python):
    from bench import overlap

    assert "hidden" in overlap.main_line(rounds=1)


@pytest.mark.slow
def test_bench_verl_step_line_runs(math_python):
    """verl's own reward loop in envs/trl, both graders on a small batch, their rewards equal."""
    from bench import verl_step

    assert "ratio" in verl_step.main_line(items=16, rounds=1)


@pytest.mark.slow
def test_bench_trl_step_line_runs(math_python):
    """TRL's GRPOTrainer in envs/trlbench, three rewards, one timed step each; the line is refused
    unless TRL's accuracy_reward and the managed grader give the same rewards on the same texts."""
    env_python("trlbench")
    from bench import trl_step

    assert "managed/TRL" in trl_step.main_line(steps=2, rounds=1)


@pytest.mark.slow
def test_bench_verl_coalesce_line_runs(math_python):
    from bench import verl_coalesce

    assert "ratio" in verl_coalesce.main_line(rounds=1, n=32)


@pytest.mark.slow
def test_every_hardening_scenario_runs(image_python):
    from bench.hardening import SCENARIOS

    for name, scenario in SCENARIOS:
        line = scenario()
        assert line and "?" not in line and "booted" not in line, (name, line)


@pytest.mark.slow
def test_bench_startup_line_runs(math_python):
    from bench import startup

    line = startup.main_line(counts=(1, 2))
    assert " 2 children: all ready in" in line and "PSS" in line
