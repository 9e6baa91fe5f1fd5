"""Stage 0: the hardware. Devices, links, presets and link microbenchmarks."""
from .cluster import Cluster, Device
from .specs import GPU_MODELS, as_cluster, cpu_cluster, parse_cluster

__all__ = ["Cluster", "Device", "GPU_MODELS", "as_cluster", "cpu_cluster", "parse_cluster"]
