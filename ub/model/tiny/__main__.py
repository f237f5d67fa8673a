"""``python -m ub.model.tiny``: the same as ``ub model tiny``."""

import sys

from ub.model.tiny.build import main

sys.exit(main())
