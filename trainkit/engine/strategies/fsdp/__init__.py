"""Everything FSDP2: the strategy, Accelerate's plugin adapter, the sharding calls, rank 0's weights onto every
rank, and meta-device loading in ``from_pretrained``."""
