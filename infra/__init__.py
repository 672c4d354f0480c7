"""hybridflow infra."""
