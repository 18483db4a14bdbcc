"""The proofs of tests/trainer/test_field_effects.py, one small function per TrainingArguments field (or group).

A proof sets a non-default value and observes its effect from outside the Trainer: what the model saw in its
forward, the files written, the log lines, the numbers torch computed, the calls torch, the Hub client or the
DataLoader received. Each must fail when trainkit ignores its field (``tests/ignore_each_field.py``).
"""
