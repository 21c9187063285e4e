"""A run prepared, before TensorFlow starts: the config resolved once into a typed `Spec`
(`resolve`), every check of a run once, returned as a `Checked` run with its lock held
(`preflight`), the run's owner, its one stack of guards (`owner`), the start-up sequence every
entry point shares (`startup`), a finished run's config composed again for evaluation and
prediction (`reopen`), what a run's model takes, kept in `model_inputs.json`, and new inputs
checked against it (`inputs`), the run's place, opened once from the composed config (a URL's
mirror and lease: `place`), a sweep's jobs (`jobs`), and what the chief and an evaluator
beside the workers hand each other through the run directory (`sidecar`).

Decide modules: none imports TensorFlow or Keras, at any level, so the entry points and the
pre-flight use them before TensorFlow starts.

The lowest room of `run/`: may import the subpackages below `run/` (their decide modules);
imports none of `run/`'s other rooms (`assembly/`, `fit/`, `end/`) nor the modules at its top.
"""
