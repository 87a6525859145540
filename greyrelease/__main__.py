import sys

from greyrelease.cli.main import main

sys.exit(main())
