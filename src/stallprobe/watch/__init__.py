"""`stallprobe watch`: the operator's view of a pool of engines, and a watchdog for engines outside Kubernetes.

The probe judges one page per process and keeps its history in a file; watch polls every engine of a pool
every --interval seconds, keeps each one's history in memory and shows their verdicts side by side. It
judges nothing itself: the scrape, the page reading, the verdicts and their words are the probe's. With
--on-stalled or --on-saturated it runs a command once per episode of an engine's verdict.

The package, one job a module:

- command.py  the flags (options.WATCH), --help, and the main loop: --once, SIGTERM, a closed pipe
- poll.py     the polling: every endpoint's look at once (loop.py, on one thread), each judged by the probe's
              one judge against its memory, the rows
- hooks.py    the hook rules: a pure function of (memory, one poll's rows, now), tested as a table
- runner.py   the hooks' processes: started in their own session, timed out, reaped
- view.py     the table on a terminal, a line or a JSON object per row, --once's exit code, the words
- serve.py    --listen: /metrics for Prometheus, /ready?url=URL for load balancers (the Board they read)
- agent.py    --agent: HAProxy's agent check, answered from the same Board
"""

from __future__ import annotations

from .command import main

__all__ = ["main"]
