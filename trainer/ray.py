"""`python -m trainer.ray --workers N [--address HOST:PORT] [overrides... | script.py
[args...]]`: one multi-worker run on a Ray cluster, Ray Train placing and restarting the
workers.

The command users type; the integration itself lives in `trainer.distribute.on_ray`.
"""

import sys

from trainer.distribute.on_ray import main

if __name__ == "__main__":
    sys.exit(main())
