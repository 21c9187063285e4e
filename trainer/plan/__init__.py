"""Plans: the pure arithmetic of a run. Batch sizes per replica and globally, micro-batches,
the scaled learning rate and its warm-up and decay schedule, steps per epoch, and the
precision / XLA / steps-per-execution choices.

May import `config/` only.
"""
