"""Config: the schema (dataclasses Hydra checks at compose time), its value checks, errors
and their exit codes, the one-line rendering of an error, the rule for which way a metric
improves, the building of `_target_` nodes, and the kinds of strategy a run can name (one
record each, read before TensorFlow starts).

The bottom of the package: imports nothing of ours outside `config/`, and never TensorFlow.
"""
