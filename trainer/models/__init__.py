"""Model builders, each named by a model YAML's `_target_` (`trainer.models.cnn.build`), and
export to serving formats (`formats`, checked in the pre-flight; `export`).

May import `config/` and `rundir/` (never `plan/`).
"""
