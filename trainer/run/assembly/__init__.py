"""A run assembled: the exact step both loops run (`step`; `accumulate`, its micro-batches;
`install_step`, which installs it), the model built and compiled in the strategy's scope
(`compiled`), everything a run builds before it trains, as a typed `Run` (`assemble`: the
strategy, the data, the model, the learning-rate plan), the callbacks Keras does not ship
(`callbacks`) and their wiring (`wiring`); and a run restored: a training run from its newest
backup (`resume`), a finished run for evaluation and prediction (`restore`, with `load`: a
checkpoint as a Keras model).

Build modules: TensorFlow or Keras at their top, or a module that imports them.

May import `prepare/` and every subpackage below `run/`; imports none of `fit/`, `end/` nor
the modules at `run/`'s top.
"""
