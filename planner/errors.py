"""The planner's domain error."""


class NoFeasiblePlan(Exception):
    """No plan exists for the table; `reason` says why (failures, memory, missing ranges)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
