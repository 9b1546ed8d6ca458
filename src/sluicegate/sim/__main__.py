"""`python -m sluicegate.sim`: the simulator alone, without the rest of the CLI."""

from sluicegate.sim.cli import main

main()
