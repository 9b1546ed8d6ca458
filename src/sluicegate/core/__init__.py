"""Value types, errors and the clock: the bottom layer, importing nothing of the project."""
