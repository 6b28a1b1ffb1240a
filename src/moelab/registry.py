"""A tiny registry of named creators, so CLI choices come from what is registered.

Creators import their heavy dependencies (torch, triton) inside themselves, so registering a
backend costs nothing until it is used.
"""
from __future__ import annotations

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._creators: dict[str, Callable[[], T]] = {}

    def register(self, name: str) -> Callable[[Callable[[], T]], Callable[[], T]]:
        def deco(fn: Callable[[], T]) -> Callable[[], T]:
            if name in self._creators:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._creators[name] = fn
            return fn

        return deco

    def names(self) -> list[str]:
        return list(self._creators)

    def create(self, name: str) -> T:
        try:
            creator = self._creators[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}") from None
        return creator()

    def __contains__(self, name: str) -> bool:
        return name in self._creators
