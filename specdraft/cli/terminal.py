"""Text from run files on the terminal: escape sequences and control characters stripped, rich markup escaped.

A rank's hostname or error, a metrics field, a Slurm reason or a log's path comes from files anyone with write access
to the run folder can craft; copied to the terminal as is, ESC sequences clear the screen, move the cursor, retitle
the window or plant hyperlinks, and a '[' starts rich markup. Every view prints such text through `plain` (lines
printed with markup=False) or `safe` (inside markup), and the error boundary does the same for every message.
"""

from __future__ import annotations

import re

# ECMA-48 sequences: CSI (ESC [ or 0x9b ... final byte), OSC (ESC ] or 0x9d ... BEL or ST), DCS/SOS/PM/APC (ESC P,
# X, ^, _ ... ST) and the two-byte escapes; an unterminated string sequence runs to the end of the text.
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|(?:\x1b[\]PX^_]|[\x9d\x90\x98\x9e\x9f])(?:[^\x07\x1b\x9c]*)(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b[ -/]*[0-~]?"
)
# C0 but tab and line feed, DEL, C1, and the bidirectional overrides that reorder what the terminal shows.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_LINE_BREAKS = re.compile(r"[\n\t]+")


def plain(value: object, *, one_line: bool = False) -> str:
    """``str(value)`` without escape sequences and control characters (tab and line feed kept, or each run of them
    made one space with ``one_line``); a carriage return, which would overwrite the line, goes too."""
    text = _CONTROL.sub("", _SEQUENCE.sub("", str(value).replace("\r\n", "\n")))
    return _LINE_BREAKS.sub(" ", text) if one_line else text


_BRACKET = re.compile(r"(\\*)\[")


def safe(value: object, *, one_line: bool = False) -> str:
    """`plain` text for a rich markup string: its '[' cannot open a tag."""
    # rich's own escape() leaves a '[' that does not close into a tag ('[a'), which a later ']' can complete:
    # every '[' is escaped here, with the backslashes before it doubled so they stay literal.
    text = _BRACKET.sub(lambda m: m.group(1) * 2 + "\\[", plain(value, one_line=one_line))
    return text + "\\" if text.endswith("\\") and not text.endswith("\\\\") else text
