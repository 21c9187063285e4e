"""trainer's Optuna sweeper for Hydra (`hydra/sweeper=trainer_optuna`), on Optuna 4 and later.

Hydra finds it by scanning the `hydra_plugins` namespace package: `config` registers the
sweeper's config (and its sampler and pruner groups), `sweeper` is the `Sweeper` class. The
work is in `_impl` (Hydra's scan skips modules whose name starts with `_`), so Optuna is
imported only by a sweep that uses it.
"""
