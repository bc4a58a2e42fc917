"""What the multi-host tests plan for: one host per Ray node of `two_nodes`."""

from schemas import ClusterSpec
from tests.support.models import FAST_OPTIONS

CLUSTER = ClusterSpec(num_hosts=2, devices_per_host=2)
# The fast options, every distinct stage measured (so 2-host stages always are).
OPTIONS = FAST_OPTIONS.model_copy(update={"prune": False})
