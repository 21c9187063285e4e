"""The run directory's one owner: its lock, atomic writes, checksums, free space, backups,
recovery from a loss blow-up (`recover`), the checks that a rerun may resume, and checkpoint
verification; a run directory at a URL
(`remote`: its local mirror kept in step, and `RunPlace`, the run's place passed to what writes
or names the run; `lease`: one writer at a time there).

May import `config/`, and `internals/` for one thing: a backup's weights taken into memory as
`save_weights` reads them (`internals.keras_compile.weights_taken`).
"""
