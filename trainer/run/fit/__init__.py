"""A run trained: who drives the epochs, Keras's `fit` or trainer's own loop, over the run's
segments of epochs (`drive`), and `loop=custom`'s epoch loop around the same step `fit` runs
(`loop`).

May import `prepare/`, `assembly/` and every subpackage below `run/`; imports none of `end/` nor
the modules at `run/`'s top.
"""
