"""``python -m edgert``: the ``edgert`` command where its script is not on PATH (a ``pip install --user`` on
Jetson puts it in ~/.local/bin, which Ubuntu adds to PATH only at the next login)."""

from __future__ import annotations

import sys

from edgert.cli.main import main

if __name__ == "__main__":  # importing the module (a walk over the package) runs nothing
    sys.exit(main())
