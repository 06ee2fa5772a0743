"""Device meshes ("data", "fsdp", "expert", "context", "tensor"), logical-axis sharding rules as
data, batch sharding, expert parallelism (a mixture of experts' experts split over the
``expert`` axis), context parallelism (ring attention over a sequence split on the ``context``
axis), multi-host initialisation, and abstract TPU topologies to compile for from a CPU host.
Batches are batch-major ``[B, T]``; rows are split over the ``batch`` rule's mesh axes, and
with context parallelism the tokens of a row over the ``length`` rule's (``context.py``: the
mesh a traced forward runs under, the batch's token layout inside the train step)."""

from jaxrl_llm.models.layout import ACTIVATION_RULES, activation_spec, constrain, layout_mesh
from jaxrl_llm.models.moe import EXPERT_AXIS
from jaxrl_llm.models.ring_attention import CONTEXT_AXIS, ring_attention
from jaxrl_llm.parallel.context import (
    batch_split,
    check_token_lengths,
    constrain_batch,
    context_size,
    under_mesh,
)
from jaxrl_llm.parallel.distributed import detected_cluster, initialize_distributed, watch_peers
from jaxrl_llm.parallel.host_rows import (
    agree_width,
    check_host_blocks,
    gather_numbers,
    gather_packed,
    gather_strings,
    host_local_batch_to_global,
    host_local_rows,
    on_processes,
    over_processes,
    process_mesh,
    process_share,
    rows_to_global,
    rows_to_local,
    take_rows,
    to_global,
    to_host,
)
from jaxrl_llm.parallel.mesh import MESH_AXES, free_memory, make_mesh, mesh_shape, split_devices
from jaxrl_llm.parallel.rules import (
    DEFAULT_RULES,
    ShardingFallbackWarning,
    batch_sharding,
    batch_sharding_tree,
    logical_to_sharding,
    logical_to_spec,
    replicated,
    token_sharding,
)
from jaxrl_llm.parallel.topology import (
    TPU_HBM_BYTES,
    LibtpuMissingError,
    Topology,
    libtpu_available,
    parse_topology_name,
    topology_mesh,
    tpu_topology,
)

__all__ = [
    "ACTIVATION_RULES",
    "activation_spec",
    "batch_split",
    "constrain",
    "free_memory",
    "layout_mesh",
    "CONTEXT_AXIS",
    "DEFAULT_RULES",
    "EXPERT_AXIS",
    "LibtpuMissingError",
    "MESH_AXES",
    "ShardingFallbackWarning",
    "TPU_HBM_BYTES",
    "Topology",
    "batch_sharding",
    "batch_sharding_tree",
    "check_token_lengths",
    "constrain_batch",
    "context_size",
    "agree_width",
    "check_host_blocks",
    "gather_numbers",
    "gather_packed",
    "gather_strings",
    "over_processes",
    "process_mesh",
    "take_rows",
    "rows_to_global",
    "rows_to_local",
    "detected_cluster",
    "on_processes",
    "process_share",
    "to_global",
    "to_host",
    "host_local_batch_to_global",
    "host_local_rows",
    "initialize_distributed",
    "watch_peers",
    "libtpu_available",
    "logical_to_sharding",
    "logical_to_spec",
    "make_mesh",
    "mesh_shape",
    "parse_topology_name",
    "replicated",
    "split_devices",
    "ring_attention",
    "token_sharding",
    "topology_mesh",
    "tpu_topology",
    "under_mesh",
]
