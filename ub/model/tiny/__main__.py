"""``python -m ub.model.tiny``: the same as ``ub model tiny``. A command, like :mod:`ub.cli`
(docs/architecture.md: its layer is the commands'), so it may import the command line."""

import sys

from ub.cli.model import tiny_main

sys.exit(tiny_main())
