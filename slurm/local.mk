# Job scripts, installed under $(pkgdatadir)/slurm (slurm/qwen3_256gpu.sh is
# listed with the runtime, src/runtime/local.mk).
nobase_dist_pkgdata_DATA += slurm/gb200_nvl72.sh slurm/cpu_example.sh
