"""Name → factory registries (timm style).

Every teacher, dataset loader, loss and method is registered under a stable name, so configs,
the CLI and the tests refer to things by name and the tests can be parametrized over a registry
(everything registered is tested by construction).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from mmcse.errors import MmcseError


class UnknownNameError(MmcseError, KeyError):
    """A name nobody registered (a user error); the message lists the known names. Also a
    KeyError, for callers that look names up."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0])


class Registry:
    """A named collection of factories (classes or functions)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Any] = {}

    def register(self, name: str) -> Callable[[Any], Any]:
        def decorator(obj: Any) -> Any:
            if name in self._entries and self._entries[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> Any:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries)) or "none"
            raise UnknownNameError(f"unknown {self.kind} {name!r}; known: {known}") from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)


LOSSES = Registry("loss")
METHODS = Registry("method")

register_loss = LOSSES.register
register_method = METHODS.register
