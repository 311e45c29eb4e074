"""The ``team`` label of the metrics, bounded: the busiest teams by name, every other team as ``other``.

Every team would be a series per label combination; a gateway with hundreds of keys would flood
Prometheus. A team gets its own label value while it is among the ``limit`` busiest (model calls counted
since the process started); the others count as ``other``. A team that drops out keeps the series it
has (a counter never goes back) and counts as ``other`` from then on, and at most ``2 * limit`` teams are
ever named, so the series stay bounded however the ranking moves.
"""

from __future__ import annotations

import heapq

from proxy.kernel.tenancy import team_of

OTHER = "other"


class TeamLabels:
    """The label value of each model call's team."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._calls: dict[str, int] = {}
        self._named: set[str] = set()

    def label(self, context_id: str) -> str:
        """Count one model call of ``context_id``'s team and return the label value it is counted under."""
        team = team_of(context_id)
        calls = self._calls[team] = self._calls.get(team, 0) + 1
        if team not in self._named and len(self._named) >= 2 * self.limit:
            return OTHER  # every label is given out: no ranking can name this team
        if len(self._calls) <= self.limit:
            busiest = True  # no more teams than labels: every team is among the busiest
        else:
            busiest = calls >= min(heapq.nlargest(self.limit, self._calls.values()))
        if busiest and (team in self._named or len(self._named) < 2 * self.limit):
            self._named.add(team)
            return team
        return OTHER
