"""hybridflow serving."""
