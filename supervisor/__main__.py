"""`python -m supervisor`: the `managed-scorers` CLI, for an env whose scripts are not on PATH."""

from supervisor.ops.cli import main

raise SystemExit(main())
