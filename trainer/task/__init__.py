"""The task: loss, metrics, optimizer and the user's callbacks built from config, and
fine-tuning phases. (Model builders live in `trainer.models`, named by `_target_`.)

May import `config/`, `plan/`, `rundir/`, `data/` and `models/`.
"""
