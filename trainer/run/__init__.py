"""A run, in order: the pre-flight checks, assembling everything inside the strategy's
scope, the steps (fit's and the custom loop's, with accumulation), the callbacks, the
summary, and `train()` itself; plus keeping TensorFlow's start-up quiet.

The top of the library: may import every other subpackage; none of them imports `run/`.
"""
