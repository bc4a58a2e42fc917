"""The result of a candidate whose measurement produced none (timeout, lost worker)."""

import planner
from schemas import ClusterSpec, ProfileStatus, StageProfileResult
from workers.cluster import CandidateTask


class FailureFactory:
    """Makes the result of a candidate that produced none (timeout, lost worker), from the
    space of its spec (`spaces` by model key; the first: the pool's own spec)."""

    def __init__(self, spaces: dict[str, planner.CandidateSpace], cluster: ClusterSpec) -> None:
        self.spaces = spaces
        self.default = next(iter(spaces.values()))
        self.cluster = cluster

    def make(self, task: CandidateTask, status: ProfileStatus, error: str) -> StageProfileResult:
        space = self.spaces.get(task.model_key, self.default)
        submesh, config = space.resolve(task.key)
        return StageProfileResult(
            status=status,
            error=error,
            fingerprint=task.fingerprint,
            key=task.key,
            submesh=submesh,
            config=config,
            num_layers=task.key.end - task.key.start + 1,
            available_memory=self.cluster.device_memory_bytes,
        )
