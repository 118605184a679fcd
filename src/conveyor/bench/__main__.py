"""``python -m conveyor.bench``: the benchmark without the ``conveyor`` console script."""

import sys

from conveyor.bench import main

sys.exit(main())
