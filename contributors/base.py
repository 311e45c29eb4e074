"""What the built-in contributors share: a factory per contributor class and typed operator options.

Each contributor class declares ``Options``, a pydantic model (``extra="forbid"``, constraints and a
description per field). The registry validates the operator's ``contributors.<id>`` section against it
once, at start-up (an error names ``contributors.<id>.<field>``), and the collector hands each
contributor its own validated instance as ``request.options``. ``docs/settings.md`` documents every
field of these models (``tests/contributors/test_options_docs.py`` fails on one it does not name).
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict

from proxy.context.types import (
    DEFAULT_PRIORITY,
    SCOPES,
    ContributionRequest,
    Contributor,
    ContributorFactory,
    ContributorOutput,
    Scope,
)

ALL_SCOPES: frozenset[Scope] = frozenset(SCOPES)
OptionsT = TypeVar("OptionsT", bound=BaseModel)


class ContributorOptions(BaseModel):
    """The base of every built-in contributor's options: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class NoOptions(ContributorOptions):
    """A contributor without options: any key is an error (a typo must not pass silently)."""


def options_for(request: ContributionRequest, model: type[OptionsT]) -> OptionsT:
    """``request.options`` as ``model``: the instance validated at start-up, or validated now when a caller
    (a unit test, a factory composed in code) handed in a plain mapping."""
    options = request.options
    if isinstance(options, model):
        return options
    return model.model_validate(dict(options or {}))


class BuiltinContributor(Contributor):
    """A contributor whose ID, scopes, protection, priority and options are fixed by its class."""

    id: ClassVar[str]
    scopes: ClassVar[frozenset[Scope]] = ALL_SCOPES
    protected: ClassVar[bool] = False
    priority: ClassVar[int] = DEFAULT_PRIORITY
    # ``contribute`` never awaits: the collector runs it in the pipeline's task, without a task and a timer
    # of its own (``tests/contributors/test_builtins_run_inline.py`` fails on a built-in that awaits).
    runs_inline: ClassVar[bool] = True
    Options: ClassVar[type[ContributorOptions]] = NoOptions

    @abstractmethod
    async def contribute(self, request: ContributionRequest) -> ContributorOutput:
        """This contributor's output for one call."""


@dataclass(frozen=True)
class Factory(ContributorFactory):
    """The ``ContributorFactory`` of one built-in contributor class: one instance per run.

    It offers no tools and derives no channels (the base's defaults); subclasses that do override them.
    """

    contributor: type[BuiltinContributor]

    @property
    def id(self) -> str:
        """The factory ID: the contributor's ID."""
        return self.contributor.id

    @property
    def options_model(self) -> type[ContributorOptions]:
        """The pydantic model of this contributor's ``contributors.<id>`` section."""
        return self.contributor.Options

    def create(self, scope: Scope) -> BuiltinContributor | None:
        """A new contributor for ``scope``, or ``None`` when the class does not serve that scope."""
        return self.contributor() if scope in self.contributor.scopes else None
