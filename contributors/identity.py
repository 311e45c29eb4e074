"""Identity (protected): who the agent is, in the client's own words.

The section holds the operator's identity text, if any, then every ``system`` and ``developer`` message
of the client's history, verbatim and in order. The assembler should therefore not send those messages
a second time in the windowed history.

Options (``contributors: {identity: {...}}``):
    text: str, optional operator identity text placed before the client's messages.
"""

from __future__ import annotations

from pydantic import Field

from contributors.base import BuiltinContributor, ContributorOptions, Factory, options_for
from proxy.context.types import ContributionRequest, ContributorOutput, Section
from proxy.kernel.canonical import content_text

IDENTITY_ROLES = ("system", "developer")
SLOT = 0


class IdentityOptions(ContributorOptions):
    """``contributors: {identity: {...}}``."""

    text: str = Field("", description="operator identity text, placed before the client's system/developer messages")


class Identity(BuiltinContributor):
    """The protected identity section."""

    id = "identity"
    protected = True
    # It renders the client's system/developer messages, so the assembler keeps them out of the history.
    owns_client_instructions = True
    Options = IdentityOptions

    async def contribute(self, request: ContributionRequest) -> ContributorOutput:
        """One section: operator text, then the client's system/developer messages verbatim."""
        parts = [options_for(request, IdentityOptions).text]
        parts += [content_text(m.get("content")) for m in request.history if m.get("role") in IDENTITY_ROLES]
        parts = [p for p in parts if p.strip()]
        if not parts:
            return ContributorOutput()
        section = Section("identity", "\n\n".join(parts), slot=SLOT, protected=True, title="Identity")
        return ContributorOutput(sections=(section,))


factory = Factory(Identity)
