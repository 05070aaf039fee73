"""SLURM: each pack is one array task on one GPU, through submitit's SlurmExecutor.

Packs of one (partition, mode, N) group share one job array. The backend in five parts:

- :mod:`~gpupack.submit.slurm.options`: its config (partitions) and the checks of every key;
- :mod:`~gpupack.submit.slurm.rules`: the site's stated rules on what one job may ask, quoted when they refuse;
- :mod:`~gpupack.submit.slurm.request`: what a submission asks SLURM for (sbatch parameters, arrays, #SBATCH lines),
  one builder for the submission and the dry run;
- :mod:`~gpupack.submit.slurm.submitter`: :class:`SlurmSubmitter`, which submits and follows the jobs;
- :mod:`~gpupack.submit.slurm.commands`: what gpupack asks SLURM itself (sinfo, sacct), the one seam to the cluster
  besides submitit.
"""
from gpupack.submit._submitit import QuietSlurmExecutor
from gpupack.submit.slurm.options import (
    PartitionConfig,
    SlurmConfig,
    check_options,
    check_partition,
    launcher_gpu_request,
    undotted,
)
from gpupack.submit.slurm.request import (
    ArrayJob,
    array_chunks,
    lane_counts,
    resources,
    sbatch_lines,
    sbatch_parameters,
)
from gpupack.submit.slurm.rules import SiteRule, SiteRules, is_day
from gpupack.submit.slurm.submitter import SlurmSubmitter, slurm_job_environment

__all__ = ["ArrayJob", "PartitionConfig", "QuietSlurmExecutor", "SiteRule", "SiteRules", "SlurmConfig",
           "SlurmSubmitter", "array_chunks", "check_options", "check_partition", "is_day", "lane_counts",
           "launcher_gpu_request", "resources", "sbatch_lines", "sbatch_parameters", "slurm_job_environment",
           "undotted", "SUBMITTER"]

SUBMITTER = SlurmSubmitter
