"""The traffic family: a research harness kept in the repository, not shipped with the
package. Run it from the repository's root: `.venv/bin/python -m bench.family --help`."""
