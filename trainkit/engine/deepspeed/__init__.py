"""DeepSpeed configs on torch: Accelerate's placeholders (``DummyOptim``, ``DummyScheduler``), the optimizer and
schedule a config's blocks name, ZeRO-1's sharded optimizer state. The mapping of the config's keys is plain
data in :mod:`trainkit.config.deepspeed`; stages 2 and 3 run as FSDP2."""
