"""`python -m trainer.ray --workers N [--address HOST:PORT] [overrides... | script.py
[args...]]`: one multi-worker run on a Ray cluster, Ray Train placing and restarting the
workers.

The command users type; the integration itself lives in `trainer.distribute.on_ray`, which
is given the pre-flight's check of every config value to make before Ray starts anything.
"""

import sys
from collections.abc import Sequence

from trainer.distribute import on_ray
from trainer.run.prepare.preflight import check_config


def main(argv: Sequence[str] | None = None) -> int:
    return on_ray.main(argv, check=check_config)


if __name__ == "__main__":
    sys.exit(main())
