"""A run, in rooms by phase, each importing only the rooms before it (bottom first):

- `prepare/`: before TensorFlow starts (decide modules): the config resolved into a `Spec`,
  the pre-flight's `Checked` run and its owner, the start-up sequence, a finished run's
  config composed again, the model's inputs, the run directory at a URL, a sweep's jobs, the
  hand-off between the chief and an evaluator beside the workers;
- `assembly/`: the exact step (and accumulation), the compiled model, the assembled `Run`, the
  callbacks and their wiring, a run restored from its backup or, finished, for evaluation
  and prediction;
- `fit/`: who drives the epochs (Keras's `fit` or the custom loop) and the custom loop;
- `end/`: the final evaluations, the averaged model, export, the summary, and the evaluator
  beside the workers.

At the top, importing every room: the recipe (`train`: `run(checked)` and `train(cfg)`), its
session (`session`: the owner of each phase) and the session's guards (`guards`), tuning
before training (`tune`), and the process's owner (`process`: TensorFlow's log policy and
quiet start, signals at start-up, exit codes; the entry points dispatch through it).

The top of the library: may import every other subpackage; none of them imports `run/`.
`tests/test_layout.py` checks the rooms' order as it checks the subpackages'.
"""
