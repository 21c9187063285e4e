"""Tracking: experiment trackers (TensorBoard, CSV, MLflow, wandb), sweep jobs and their
trial table, and the scaling report of a sweep over devices.

May import `config/`, `plan/`, `rundir/`; never `distribute/` or `run/`.
"""
