"""The Trainer's checkpoints: one manager (:mod:`.manager`) over the ``checkpoint-N`` files (:mod:`.files`),
resuming from them (:mod:`.resume`) and the save on a preemption signal (:mod:`.preemption`).

These modules never import the Trainer: they are typed against :class:`.protocol.CheckpointedTrainer`,
the few attributes they read and write on it, so the Trainer depends on them and not the other way round.
"""
