"""`python3 -m stallprobe`: cli.run(), whose exit code becomes the process's."""

from __future__ import annotations

from stallprobe.cli import run

if __name__ == "__main__":
    run()
