"""`stallprobe doctor`: look at an engine for a few seconds, as the probe would, and say in plain lines what
was found, what the probe would do now, and the probes to give it, for someone about to adopt the probe.

It reads the one judgment: every look is observe.observe (with every look option the probe takes, and
the health route), judged by the detector (assess_engines, and readiness for routing), told in
report.py's words; the probes it prints are stanza.py's, as `stallprobe inject` writes them. One job a
module:

- first.py: the first contact: what answers at the URL, whether it wants a key; its page is the first look;
- looks.py: the looks, one a second, judged in memory (no state file), and the routes asked beside them;
- words.py: one topic a line, and the summary;
- probes.py: the probes and the `stallprobe inject` command that writes them;
- command.py: the configuration, the report's lines as they come, and main().
"""

from __future__ import annotations

from .command import DoctorConfig, configure, help_text, main, run

__all__ = ["DoctorConfig", "configure", "help_text", "main", "run"]
