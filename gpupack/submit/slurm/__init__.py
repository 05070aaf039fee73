"""SLURM: each pack is one array task on one GPU, through submitit's SlurmExecutor; packs of one (partition, mode, N)
group share one job array."""
from gpupack.submit._submitit import QuietSlurmExecutor
from gpupack.submit.slurm.options import PartitionConfig, SlurmConfig
from gpupack.submit.slurm.request import array_chunks, lane_counts, resources, sbatch_lines, sbatch_parameters
from gpupack.submit.slurm.rules import SiteRule, SiteRules, is_day
from gpupack.submit.slurm.submitter import SlurmSubmitter, slurm_job_environment

__all__ = ["PartitionConfig", "QuietSlurmExecutor", "SiteRule", "SiteRules", "SlurmConfig", "SlurmSubmitter",
           "array_chunks", "is_day", "lane_counts", "resources", "sbatch_lines", "sbatch_parameters",
           "slurm_job_environment", "SUBMITTER"]

SUBMITTER = SlurmSubmitter
