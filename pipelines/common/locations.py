"""Paths and URLs a user types, made to mean the same thing in every process.

A relative path means "relative to where I typed it"; a Ray worker runs in another directory, so
every path a command is given is made absolute in the driver before anything is sent to Ray.
"""

from __future__ import annotations

import re
from pathlib import Path

_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def is_remote_url(location: str) -> bool:
    """A URL with a scheme other than ``file`` (``s3://``, ``gs://``, ``http://``...)."""
    return bool(_SCHEME.match(location)) and not location.startswith("file://")


def absolute_location(location: str | Path) -> str:
    """A remote URL as it is; a local path (or ``file://`` URL) absolute, ``~`` expanded."""
    text = str(location)
    if is_remote_url(text):
        return text
    return str(Path(text.removeprefix("file://")).expanduser().resolve())
