"""Distribution: which devices a run uses (set before TensorFlow's runtime starts), the
cluster of a multi-worker run (TF_CONFIG, SLURM), the `tf.distribute` strategy and its
cross-device ops, what workers hand each other, and the local multi-worker launcher with its
restarts (`restarts`: whether and when a failed cluster starts again).

May import `config/`, `plan/` and `rundir/`.
"""
