"""Shared low-level helpers, the project's lowest floor: they import nothing of the project.

Every side uses them (the grading pool, the scorer child and its protocol, the trainer side, the
scorers), so they live below all of them, in the lowest package:
- `processes`: the exit-status describer and the parent-death signal (stdlib only);
- `retry`: one retry loop under an absolute deadline (stdlib only);
- `bounded_http`: HTTP exchanges with one deadline and a capped answer (imports httpx).
"""
