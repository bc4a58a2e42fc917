"""`python -m cli`: the `stageprof` command."""

import sys

from cli.main import main

sys.exit(main())
