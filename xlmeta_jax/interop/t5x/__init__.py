"""t5x interop: the t5x model, the phase handoff and the pre-flight checks."""
