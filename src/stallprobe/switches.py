"""The words a switch reads as on and off, for every switch: a flag's environment variable
(STALLPROBE_JSON=1), a flag whose value is optional (--include-waiting's old spellings), and the kill
switch's file (killswitch.py)."""

from __future__ import annotations

__all__ = ["FALSE_WORDS", "TRUE_WORDS"]

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("", "0", "false", "no", "off")
