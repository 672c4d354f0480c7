"""hybridflow tasks."""
