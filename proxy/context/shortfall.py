"""Why a call's context does not fit: what it needed, what it had, and which settings would change that.

A stage that runs out of room (budget admission: the protected sections over the prompt budget; the
window: the history's minimum over what the fixed part leaves; the validator: the composed input over
the limit) raises ``ContextDoesNotFit``, the same 400 ``context_assembly_failed`` as before, carrying a
``Shortfall``. Only the pipeline knows what the budgets are made of (the effective limit, the window,
the output reserve, the percentages, the estimator's scale), so it completes the message with
``explain``: the numbers, the setting that changes each, and the value it would fit with. The trace's
``assemblyError`` carries the same (``neededTokens``, ``budgetTokens``, ``settings``).

The context package does not import the kernel's settings: the names below are the environment
variables ``proxy/kernel/config.py`` reads, kept here as data (``tests/context/test_shortfall.py``
checks that the config reads each one).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, TypeAlias

from proxy.kernel.errors import AssemblyFailed

PROMPT_PERCENT = "SCIENCE_AGENT_CONTEXT_PROMPT_PERCENT"
MESSAGE_PERCENT = "SCIENCE_AGENT_CONTEXT_MESSAGE_PERCENT"
WINDOW_TOKENS = "SCIENCE_AGENT_CONTEXT_WINDOW_TOKENS"
MODEL_MAX_TOKENS = "MODEL_MAX_TOKENS"
OUTPUT_RESERVE_TOKENS = "OUTPUT_RESERVE_TOKENS"
ESTIMATOR = "SCIENCE_AGENT_CONTEXT_ESTIMATOR"
ESTIMATOR_START_PERCENT = "SCIENCE_AGENT_CONTEXT_ESTIMATOR_START_PERCENT"
SETTING_NAMES = (
    PROMPT_PERCENT,
    MESSAGE_PERCENT,
    WINDOW_TOKENS,
    MODEL_MAX_TOKENS,
    OUTPUT_RESERVE_TOKENS,
    ESTIMATOR,
    ESTIMATOR_START_PERCENT,
)

# What ran out: the prompt budget (protected sections), the room the fixed part leaves the history (its
# minimum), or the effective limit itself (the composed input).
Kind: TypeAlias = Literal["prompt_budget", "history", "input_limit"]


@dataclass(frozen=True)
class Shortfall:
    """What a stage needed and had, in tokens, and the settings that change it (most direct first;
    empty until the pipeline explained it)."""

    kind: Kind
    needed_tokens: int
    budget_tokens: int
    settings: tuple[str, ...] = ()


class ContextDoesNotFit(AssemblyFailed):
    """An assembly that ran out of room; ``shortfall`` says how much was needed of what budget."""

    def __init__(self, message: str, shortfall: Shortfall) -> None:
        super().__init__(message)
        self.shortfall = shortfall


@dataclass(frozen=True)
class LimitBasis:
    """What a call's budgets are made of: the effective input limit, the window and output reserve it
    came from (``window`` ``None``: not known), the budget percentages and the estimator's scale."""

    limit: int
    window: int | None
    output_reserve: int
    prompt_percent: int
    message_percent: int
    estimator_factor: float = 1.0
    stated_limit: int | None = None  # the window a provider stated in an overflow error (a forced pass)


@dataclass(frozen=True)
class FixedParts:
    """What the call costs besides the history: the system prompt, the tool schemas, contributor messages."""

    prompt_tokens: int
    tool_tokens: int
    message_tokens: int

    @property
    def total(self) -> int:
        """All of them."""
        return self.prompt_tokens + self.tool_tokens + self.message_tokens


def explain(failure: ContextDoesNotFit, basis: LimitBasis, fixed: FixedParts | None = None) -> ContextDoesNotFit:
    """``failure`` with its message completed by the budgets' numbers and the settings that change them."""
    shortfall = failure.shortfall
    limit_text, limit_settings = _limit(basis)
    needed, budget = shortfall.needed_tokens, shortfall.budget_tokens
    if shortfall.kind == "prompt_budget":
        percent = basis.prompt_percent
        fitting_percent = math.ceil(needed * 100 / basis.limit)
        fitting_limit = math.ceil(needed * 100 / percent)
        if fitting_percent <= 100:
            percent_text = f"it fits with {PROMPT_PERCENT}={fitting_percent} or more, or"
        else:
            percent_text = f"no {PROMPT_PERCENT} fits it within this limit;"
        text = (
            f"The prompt budget is {PROMPT_PERCENT}={percent} % of the effective input limit of {basis.limit} "
            f"tokens ({limit_text}): {percent_text} with an effective input limit of {fitting_limit} tokens or "
            f"more ({_larger(limit_settings)})."
        )
        settings = (PROMPT_PERCENT, *limit_settings)
    elif shortfall.kind == "history":
        missing = needed - budget
        text = f"The effective input limit is {basis.limit} tokens ({limit_text})"
        if fixed is not None:
            prompt_budget = max(1, basis.limit * basis.prompt_percent // 100)
            message_budget = max(1, basis.limit * basis.message_percent // 100)
            text += (
                f"; the system prompt takes {fixed.prompt_tokens} of it (its budget: {PROMPT_PERCENT}="
                f"{basis.prompt_percent} %, {prompt_budget} tokens), the tool schemas {fixed.tool_tokens} and "
                f"contributor messages {fixed.message_tokens} (their budget: {MESSAGE_PERCENT}="
                f"{basis.message_percent} %, {message_budget} tokens)"
            )
        text += f". It fits with an effective input limit of {basis.limit + missing} tokens or more"
        text += f" ({_larger(limit_settings)})"
        settings = limit_settings
        if fixed is not None and fixed.prompt_tokens + fixed.message_tokens > missing:
            text += f", or with {missing} fewer tokens of system prompt and contributor messages"
            text += f" ({PROMPT_PERCENT}, {MESSAGE_PERCENT})"
            settings = (*limit_settings, PROMPT_PERCENT, MESSAGE_PERCENT)
        text += "."
    else:
        text = (
            f"The effective input limit is {basis.limit} tokens ({limit_text}): it fits with an effective input "
            f"limit of {needed} tokens or more ({_larger(limit_settings)})."
        )
        settings = limit_settings
    estimator_text, estimator_settings = _estimator(basis.estimator_factor)
    explained = ContextDoesNotFit(
        f"{failure.message}. {text} {estimator_text}",
        dataclasses.replace(shortfall, settings=(*settings, *estimator_settings)),
    )
    explained.headers = failure.headers
    return explained


def _limit(basis: LimitBasis) -> tuple[str, tuple[str, ...]]:
    """Where the effective limit comes from, in words, and the settings that set it."""
    window, reserve = basis.window, basis.output_reserve
    stated = ""
    if window is not None and basis.stated_limit == window:
        stated = " stated by the provider in an overflow error"
    if window is not None and basis.limit == window - reserve:
        return (
            f"the {window}-token context window{stated} minus the {reserve}-token output reserve: "
            f"{MODEL_MAX_TOKENS} - {OUTPUT_RESERVE_TOKENS}",
            (MODEL_MAX_TOKENS, OUTPUT_RESERVE_TOKENS),
        )
    shape = f"; the context window is {window}{stated}, the output reserve {reserve}" if window is not None else ""
    return (
        f"the smaller of {WINDOW_TOKENS} and {MODEL_MAX_TOKENS} - {OUTPUT_RESERVE_TOKENS}{shape}",
        (WINDOW_TOKENS, MODEL_MAX_TOKENS, OUTPUT_RESERVE_TOKENS),
    )


def _larger(limit_settings: tuple[str, ...]) -> str:
    """How the limit's settings make it larger: the reserve by shrinking, the others by growing."""
    larger = [f"a larger {name}" for name in limit_settings if name != OUTPUT_RESERVE_TOKENS]
    return ", ".join(larger) + f" or a smaller {OUTPUT_RESERVE_TOKENS}"


def _estimator(factor: float) -> tuple[str, tuple[str, ...]]:
    """What the token counts are, and the settings that change them."""
    if factor == 1.0:
        return f"Token counts are estimates ({ESTIMATOR}).", (ESTIMATOR,)
    return (
        f"Token counts are estimates ({ESTIMATOR}), here scaled x{factor:.2f}, a calibrated route's correction "
        f"({ESTIMATOR_START_PERCENT} / 100 until the route's first answers).",
        (ESTIMATOR, ESTIMATOR_START_PERCENT),
    )
