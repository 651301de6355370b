"""`python3 -m stallprobe`: the exit code of cli.main() becomes the process's."""

from __future__ import annotations

import sys

from stallprobe.cli import main

if __name__ == "__main__":
    sys.exit(main())
