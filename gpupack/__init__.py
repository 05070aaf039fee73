"""gpupack: pack N small trainings per GPU, measure time per training, pick the best packing factor."""

__version__ = "0.1.0"
