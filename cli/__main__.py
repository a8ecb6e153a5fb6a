"""`python -m interlock.cli`: the `interlock` command."""
import sys

from interlock.cli import main

sys.exit(main())
