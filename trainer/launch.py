"""`python -m trainer.launch --workers N [overrides... | script.py [args...]]`: the local
multi-worker launcher.

The command users type; the launcher itself lives in `trainer.distribute.launch`.
"""

import sys

from trainer.distribute.launch import main

if __name__ == "__main__":
    sys.exit(main())
