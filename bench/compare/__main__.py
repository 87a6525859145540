"""`python -m bench.compare`: see bench/compare/__init__.py."""

import sys

from bench.compare.cli import main

if __name__ == "__main__":
    sys.exit(main())
