"""Training workloads that gpupack packs. One module per workload, each exposing ``WORKLOAD``."""
