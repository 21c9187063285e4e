"""A run's end: every validation example evaluated once, the test split with the checkpoint
validation chose, the averaged model tested, the export and a stop asked for (`finish`), the
summary on screen and in `summary.json` (`summary`), and the evaluator beside the workers, a
process of its own that validates each epoch's weights, keeps `best.keras` and runs the final
test (`evaluator`).

May import `prepare/`, `assembly/`, `fit/` and every subpackage below `run/`; imports none of
the modules at `run/`'s top.
"""
