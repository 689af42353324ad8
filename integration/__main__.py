"""`python -m integration ...` is the `tpcost` command."""

import sys

from .cli import main

sys.exit(main())
