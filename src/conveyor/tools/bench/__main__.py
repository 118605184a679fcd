"""``python -m conveyor.tools.bench``: the benchmark without the ``conveyor`` console script."""

import sys

from conveyor.tools.bench import main

sys.exit(main())
