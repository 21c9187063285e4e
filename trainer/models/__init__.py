"""Model builders, each named by a model YAML's `_target_` (`trainer.models.cnn.build`), and
the loading of a run's `.keras` checkpoint.

May import `config/`, `plan/` and `rundir/`.
"""
