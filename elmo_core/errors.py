"""One exception family for errors a user can cause.

Each message names the file and line or the dotted config key, so the CLI can print it without a
traceback.
"""

from __future__ import annotations

from pathlib import Path


class ElmoError(Exception):
    """Base class of user-caused errors: the message alone tells the user what to fix."""

    def __reduce__(self) -> tuple[object, ...]:
        # Rebuild from the original arguments so the file/line/key survive a trip through a
        # worker process (pickle would otherwise re-wrap the already formatted message).
        return (_rebuild, (type(self), self._message, self._where))

    def _remember(self, message: str, **where: object) -> None:
        self._message = message
        self._where = where


def _rebuild(cls: type[ElmoError], message: str, where: dict[str, object]) -> ElmoError:
    return cls(message, **where)  # type: ignore[call-arg]


class ConfigError(ElmoError):
    """A configuration value is missing, misspelt or out of range."""

    def __init__(self, message: str, *, key: str | None = None, source: str | None = None) -> None:
        where = ", ".join(part for part in (source, f"key '{key}'" if key else None) if part)
        super().__init__(f"{where}: {message}" if where else message)
        self._remember(message, key=key, source=source)
        self.key = key
        self.source = source


class DataError(ElmoError):
    """An input file is missing, empty, corrupt or malformed."""

    def __init__(
        self, message: str, *, path: str | Path | None = None, line: int | None = None
    ) -> None:
        where = str(path) if path is not None else ""
        if line is not None:
            where = f"{where}:{line}" if where else f"line {line}"
        super().__init__(f"{where}: {message}" if where else message)
        self._remember(message, path=path, line=line)
        self.path = str(path) if path is not None else None
        self.line = line


class WeightsError(ElmoError):
    """A weight file does not match its options, or is of another layout."""

    def __init__(self, message: str, *, path: str | Path | None = None) -> None:
        super().__init__(f"{path}: {message}" if path is not None else message)
        self._remember(message, path=path)
        self.path = str(path) if path is not None else None
