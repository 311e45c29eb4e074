"""What the built-in contributors share: a factory per contributor class and operator-option checks.

Operator options arrive with every call (``ContributionRequest.options[<contributor id>]``, from the
YAML config's ``contributors:`` section). Each contributor parses its own; a bad option is an
:class:`OptionsError` naming ``contributors.<id>.<key>`` and the bad value. ``Factory.validate_options``
runs the same parse, so the service can refuse a bad config at start-up instead of on the first call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from proxy.context.types import SCOPES, ContributionRequest, ContributorOutput, Scope

ALL_SCOPES: frozenset[Scope] = frozenset(SCOPES)


class OptionsError(ValueError):
    """An operator option for a contributor is invalid; the message names it and the bad value."""


class BuiltinContributor(ABC):
    """A contributor whose ID, scopes and protection are fixed by its class."""

    id: ClassVar[str]
    scopes: ClassVar[frozenset[Scope]] = ALL_SCOPES
    protected: ClassVar[bool] = False
    option_keys: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def parse_options(cls, raw: Mapping[str, Any]) -> Mapping[str, Any]:
        """Check the operator's options (unknown keys are errors: a typo must not pass silently)."""
        unknown = sorted(set(raw) - cls.option_keys)
        if unknown:
            allowed = ", ".join(sorted(cls.option_keys)) or "none"
            raise OptionsError(f"contributors.{cls.id}: unknown option(s) {', '.join(unknown)}; allowed: {allowed}")
        cls.check_options(raw)
        return raw

    @classmethod
    def check_options(cls, raw: Mapping[str, Any]) -> None:
        """Check the values of the known options; subclasses with options override this."""
        return None

    def options(self, request: ContributionRequest) -> Mapping[str, Any]:
        """This contributor's checked options for ``request``."""
        return self.parse_options(request.options.get(self.id) or {})

    @abstractmethod
    async def contribute(self, request: ContributionRequest) -> ContributorOutput:
        """This contributor's output for one call."""


@dataclass(frozen=True)
class Factory:
    """The ``ContextContributorFactory`` of one built-in contributor class: one instance per run."""

    contributor: type[BuiltinContributor]

    @property
    def id(self) -> str:
        """The factory ID: the contributor's ID."""
        return self.contributor.id

    def create(self, scope: Scope) -> BuiltinContributor | None:
        """A new contributor for ``scope``, or ``None`` when the class does not serve that scope."""
        return self.contributor() if scope in self.contributor.scopes else None

    def validate_options(self, raw: Mapping[str, Any]) -> None:
        """Raise :class:`OptionsError` if ``raw`` is not valid for this contributor (for start-up)."""
        self.contributor.parse_options(raw)


def text_option(raw: Mapping[str, Any], owner: str, key: str) -> str:
    """A string option, ``""`` when absent."""
    value = raw.get(key, "")
    if not isinstance(value, str):
        raise OptionsError(f"contributors.{owner}.{key} must be a string, got {value!r}")
    return value


def names_option(raw: Mapping[str, Any], owner: str, key: str) -> list[str] | None:
    """A list of non-empty strings, ``None`` when absent."""
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise OptionsError(f"contributors.{owner}.{key} must be a list of non-empty strings, got {value!r}")
    return list(value)


def int_option(raw: Mapping[str, Any], owner: str, key: str, default: int) -> int:
    """A positive integer option."""
    value = raw.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise OptionsError(f"contributors.{owner}.{key} must be a positive integer, got {value!r}")
    return value
