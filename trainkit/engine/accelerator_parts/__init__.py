"""The pieces of Accelerate's ``Accelerator`` API that the facade (:mod:`trainkit.engine.accelerator`) is made of:
process identity, trackers, prepared objects, the less common options, and the arguments as settings."""
