"""The generic context package: contracts, registry, collection, admission, rendering, window, validation.

Pure code: no I/O, no web app, no store, no provider client. The assembler drives the stages in the
order SPEC.md gives; each stage returns plain data the trace can serialize.
"""

from proxy.context.budget import BudgetResult, apply_context_budget
from proxy.context.collector import Collection, ContributorRun, collect_detailed, validate_output
from proxy.context.composer import ComposedContext, DefaultContextMessageComposer
from proxy.context.estimators import CachingEstimator, ConservativeTokenEstimator, TiktokenEstimator
from proxy.context.hidden import escape_body, hidden_message, is_hidden_message, unescape_body
from proxy.context.message_count import MessageCountResult, apply_message_count_cap
from proxy.context.registry import (
    ENTRY_POINT_GROUP,
    ContextContributorRegistry,
    FactorySource,
    RegistryError,
    discover_factories,
)
from proxy.context.renderer import DeterministicSystemPromptRenderer, RenderedPrompt
from proxy.context.types import (
    Attachment,
    ContextContributor,
    ContextContributorFactory,
    ContextMessage,
    ContributionRequest,
    Contributor,
    ContributorFactory,
    ContributorOutput,
    Diagnostic,
    Scope,
    Section,
    TokenEstimator,
)
from proxy.context.validator import ContextValidator
from proxy.context.window import AtomicHistoryWindowPolicy, WindowResult, WindowStatistics

__all__ = [
    "ENTRY_POINT_GROUP",
    "AtomicHistoryWindowPolicy",
    "Attachment",
    "BudgetResult",
    "CachingEstimator",
    "Collection",
    "ComposedContext",
    "ConservativeTokenEstimator",
    "ContextContributor",
    "ContextContributorFactory",
    "ContextContributorRegistry",
    "ContextMessage",
    "ContextValidator",
    "ContributionRequest",
    "Contributor",
    "ContributorFactory",
    "ContributorOutput",
    "ContributorRun",
    "DefaultContextMessageComposer",
    "DeterministicSystemPromptRenderer",
    "Diagnostic",
    "FactorySource",
    "MessageCountResult",
    "RegistryError",
    "RenderedPrompt",
    "Scope",
    "Section",
    "TiktokenEstimator",
    "TokenEstimator",
    "WindowResult",
    "WindowStatistics",
    "apply_context_budget",
    "apply_message_count_cap",
    "collect_detailed",
    "discover_factories",
    "escape_body",
    "hidden_message",
    "is_hidden_message",
    "unescape_body",
    "validate_output",
]
