"""One optimizer step: gradient accumulation windows, the optimizer and scheduler wrappers, compiling and unwrapping
the prepared model."""
