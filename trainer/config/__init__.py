"""Config: the schema (dataclasses Hydra checks at compose time), its value checks, errors
and their exit codes, the one-line rendering of an error, the rule for which way a metric
improves, and the building of `_target_` nodes.

The bottom of the package: imports nothing of ours outside `config/`, and never TensorFlow.
"""
