"""A run: the pre-flight (every check once, a `Checked` run), its owner (the one stack of
guards), the start-up sequence (`startup`, written once for every entry point), the
process's owner (quiet start, signals, exit codes), the recipe (`train.run`) and its session
(one owner per phase), the steps (fit's and the custom loop's, with accumulation), the
callbacks, the summary, and restoring a finished run for evaluation and prediction.

Decide modules (`preflight`, `resolve`, `owner`, `startup`, `process`, `jobs`, `reopen`)
import no TensorFlow; the others import it at their top.

The top of the library: may import every other subpackage; none of them imports `run/`.
"""
