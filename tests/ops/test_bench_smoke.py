"""Every line of `make bench` still runs against the current code: each with its smallest sizes
(`Line.smoke`, what `python -m bench --smoke` runs), its figures not asserted. A line returns its
text only after its own checks (rewards equal, verdicts unchanged), which the smoke sizes never
skip."""

from __future__ import annotations

import pytest

from bench.__main__ import LINES, Line, main
from tests.conftest import env_python


@pytest.mark.slow
@pytest.mark.parametrize("line", LINES, ids=[line.name for line in LINES])
def test_every_bench_line_runs_with_its_smallest_sizes(line: Line):
    for env in line.envs:
        env_python(env)  # a missing env fails here, naming its make target
    text = line(smoke=True)
    # where Ray cannot be installed (envs/ray/UNAVAILABLE)
    if line.name == "ray_pool" and "SKIPPED" in text:
        pytest.skip(text)
    assert all(shown in text for shown in line.shows), text


def test_the_bench_lists_its_lines_by_name(capsys):
    main(["--list"])
    assert capsys.readouterr().out.split() == [line.name for line in LINES]
    assert len({line.name for line in LINES}) == len(LINES)


@pytest.mark.slow
def test_every_hardening_scenario_runs(image_python):
    from bench.hardening import SCENARIOS, SMOKE

    assert set(SMOKE) <= {name for name, _ in SCENARIOS}
    for name, scenario in SCENARIOS:
        line = scenario(**SMOKE.get(name, {}))
        assert line and "?" not in line and "booted" not in line, (name, line)
