"""Run contract (protected, never truncated): the terms this run works under.

Taken from the first of: the request body's ``metadata.run_contract`` (a string, or JSON data rendered
as stable indented JSON), the ``x-run-contract`` header, the operator's ``profile``. The client's own
contract wins over the operator default because the client knows the run; the operator's limits belong
in governance, which always applies. No contract, no section.

Options (``contributors: {run_contract: {...}}``):
    profile: str, the default contract text when the client sends none.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import Field

from contributors.base import BuiltinContributor, ContributorOptions, Factory, options_for
from proxy.context.types import ContributionRequest, ContributorOutput, Section

SLOT = 20
HEADER = "x-run-contract"


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    # Stable bytes for the same contract, so the system prompt stays cacheable.
    return json.dumps(value, sort_keys=True, indent=2, ensure_ascii=False)


def find_contract(request: ContributionRequest, profile: str) -> tuple[str, str] | None:
    """``(source, text)`` of the contract for ``request``, or ``None``."""
    value = request.metadata.get("run_contract")
    if value not in (None, "", {}, []):
        return "metadata.run_contract", _render(value)
    header = next((v for k, v in request.headers.items() if k.lower() == HEADER), "")
    if header.strip():
        return f"{HEADER} header", header
    if profile.strip():
        return "operator profile", profile
    return None


class RunContractOptions(ContributorOptions):
    """``contributors: {run_contract: {...}}``."""

    profile: str = Field("", description="the default contract text when the client sends none")


class RunContract(BuiltinContributor):
    """The protected run-contract section."""

    id = "run_contract"
    protected = True
    Options = RunContractOptions

    async def contribute(self, request: ContributionRequest) -> ContributorOutput:
        """The contract section, naming where the contract came from."""
        found = find_contract(request, options_for(request, RunContractOptions).profile)
        if found is None:
            return ContributorOutput()
        source, text = found
        section = Section(
            "run_contract", f"(from the {source})\n{text}", slot=SLOT, protected=True, title="Run contract"
        )
        return ContributorOutput(sections=(section,))


factory = Factory(RunContract)
