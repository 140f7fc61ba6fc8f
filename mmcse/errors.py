"""User-facing errors: the CLI prints their message on one line and exits non-zero."""


class MmcseError(Exception):
    """Bad input or state a user can fix; the message says what and where, on one line."""


class CacheError(MmcseError):
    """A feature set or corpus is missing, invalid, corrupted or does not match a run."""


class MissingIdsError(CacheError):
    """Ids asked for are not in a feature set (the message names the set and some ids)."""
