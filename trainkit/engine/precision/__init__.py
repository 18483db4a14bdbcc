"""Mixed precision: one object per mode that converts the module, wraps the forward, scales the backward, steps the
optimizer and carries its state. The contract is :mod:`.base`, the modes are in :mod:`.registry`."""
