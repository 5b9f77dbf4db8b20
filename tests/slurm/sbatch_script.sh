#!/bin/sh
# slurm/qwen3_256gpu.sh, the script users submit: valid bash, only sbatch and
# srun options this Slurm knows, and a namelist plus layout that moetrain
# accepts for the 256 processes it asks for (its --check mode).
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
script="$MT_TOP_SRCDIR/slurm/qwen3_256gpu.sh"
bash -n "$script" || fail "bash -n"
cd "$tmp"

if command -v sbatch > /dev/null 2>&1 && command -v srun > /dev/null 2>&1; then
    # --help needs some configuration; task/affinity makes srun list --cpu-bind.
    printf 'ClusterName=help\nSlurmctldHost=localhost\nTaskPlugin=task/affinity\n' > help.conf
    SLURM_CONF=$tmp/help.conf sbatch --help > sbatch.help 2>&1
    SLURM_CONF=$tmp/help.conf srun --help > srun.help 2>&1
    grep -q -- '--nodes' sbatch.help && grep -q -- '--mpi' srun.help || fail "no sbatch/srun --help"
    sed -n 's/^#SBATCH \(--[a-z-]*\).*/\1/p' "$script" > sbatch.opts
    [ -s sbatch.opts ] || fail "no #SBATCH options found"
    for o in $(cat sbatch.opts); do
        grep -q -- "$o[=[ ]" sbatch.help || fail "#SBATCH $o is not an sbatch option"
    done
    grep '^srun ' "$script" | grep -o -- '--[a-z-]*' > srun.opts
    grep -qx -- '--mpi' srun.opts && grep -qx -- '--cpu-bind' srun.opts || fail "srun line lacks --mpi/--cpu-bind"
    for o in $(cat srun.opts); do
        grep -q -- "$o[=[ ]" srun.help || fail "srun $o is not an srun option"
    done
    echo "ok: $(wc -l < sbatch.opts) #SBATCH and $(wc -l < srun.opts) srun options exist"
else
    echo "no sbatch/srun here: options not checked"
fi

# --check: the namelist and the layout, for 64 x 4 processes.
mkdir bin && ln -s "$MOETRAIN" bin/moetrain
PATH="$tmp/bin:$PATH" MOETRAIN_NAMELISTS="$MT_TOP_SRCDIR/namelists" bash "$script" --check > out 2> err ||
    { cat out err; fail "--check"; }
grep -q 'valid for 256 processes' out && grep -q 'world 256 = TP 2 x CP 1 x PP 4 x DP 32; experts: ETP 1 x EP 8 x EDP 8' out ||
    { cat out; fail "--check output"; }
echo "ok: --check for 256 processes"
