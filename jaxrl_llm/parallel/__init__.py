"""Device meshes ("data", "fsdp", "tensor"), logical-axis sharding rules as data, batch
sharding, and multi-host initialisation. Batches are batch-major ``[B, T]``; rows are split
over the ``batch`` rule's mesh axes."""

from jaxrl_llm.parallel.distributed import (
    host_local_batch_to_global,
    host_local_rows,
    initialize_distributed,
)
from jaxrl_llm.parallel.mesh import MESH_AXES, make_mesh, mesh_shape
from jaxrl_llm.parallel.rules import (
    DEFAULT_RULES,
    ShardingFallbackWarning,
    batch_sharding,
    batch_sharding_tree,
    logical_to_sharding,
    logical_to_spec,
    replicated,
)

__all__ = [
    "DEFAULT_RULES",
    "MESH_AXES",
    "ShardingFallbackWarning",
    "batch_sharding",
    "batch_sharding_tree",
    "host_local_batch_to_global",
    "host_local_rows",
    "initialize_distributed",
    "logical_to_sharding",
    "logical_to_spec",
    "make_mesh",
    "mesh_shape",
    "replicated",
]
