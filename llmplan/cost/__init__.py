"""Cost model: pure functions over specs (parameters, memory, ...)."""
