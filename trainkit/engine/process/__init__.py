"""Processes: who this process is (state, device), how processes talk (collectives, barriers, turns), how they are
started from Python, and how they stop together (preemption, uneven inputs)."""
