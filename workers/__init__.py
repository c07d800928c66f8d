"""fairgate's workers: the engine interface, the simulated engine model and (later) vLLM."""
