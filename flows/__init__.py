"""hybridflow flows."""
