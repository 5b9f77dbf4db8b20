#!/bin/sh
# The GPU job scripts users submit, slurm/qwen3_256gpu.sh and
# slurm/gb200_nvl72.sh: valid bash, only sbatch and srun options this Slurm
# knows (22.05 here; options of later versions stay commented out), a namelist
# plus layout that moetrain accepts for the processes they ask for (their
# --check mode, which reads the #SBATCH lines), and a job of another shape than
# those lines stopped before srun.
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
cd "$tmp"
for script in "$MT_TOP_SRCDIR/slurm/qwen3_256gpu.sh" "$MT_TOP_SRCDIR/slurm/gb200_nvl72.sh"; do
    bash -n "$script" || fail "bash -n $script"

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
        echo "ok: ${script##*/}: $(wc -l < sbatch.opts) #SBATCH and $(wc -l < srun.opts) srun options exist"
    else
        echo "no sbatch/srun here: options not checked"
    fi
done

# --check: the namelist and the layout, for 64 x 4 processes.
script=$MT_TOP_SRCDIR/slurm/qwen3_256gpu.sh
mkdir bin && ln -s "$MOETRAIN" bin/moetrain
PATH="$tmp/bin:$PATH" MOETRAIN_NAMELISTS="$MT_TOP_SRCDIR/namelists" bash "$script" --check > out 2> err ||
    { cat out err; fail "--check"; }
grep -q 'valid for 256 processes' out && grep -q 'world 256 = TP 2 x CP 1 x PP 4 x DP 32; experts: ETP 1 x EP 8 x EDP 8' out ||
    { cat out; fail "--check output"; }
echo "ok: --check for 256 processes"

# The shape in one place: --check follows an edited --nodes line; a job given
# another node count or tasks per node stops before srun (a stand-in srun
# records whether it ran); the job of the lines' shape reaches srun.
sed 's/^#SBATCH --nodes=64$/#SBATCH --nodes=32/' "$script" > q32.sh
grep -q '^#SBATCH --nodes=32$' q32.sh || fail "no '#SBATCH --nodes=64' line to edit"
PATH="$tmp/bin:$PATH" MOETRAIN_NAMELISTS="$MT_TOP_SRCDIR/namelists" bash q32.sh --check > out 2> err ||
    { cat out err; fail "--check of the 32-node edit"; }
grep -q 'valid for 128 processes' out || { cat out; fail "--check did not follow #SBATCH --nodes"; }
printf '#!/bin/sh\necho "srun $*" >> %s/srun.log\n' "$tmp" > bin/srun && chmod +x bin/srun
for shape in "32 4" "64 2"; do
    set -- $shape
    SLURM_JOB_ID=1 SLURM_JOB_NUM_NODES=$1 SLURM_NTASKS_PER_NODE=$2 PATH="$tmp/bin:$PATH" \
        bash "$script" > out 2> err && { cat out err; fail "a job of $1 x $2 ran"; }
    grep -q "this job has $1 nodes x $2 tasks per node; its layout is for 64 x 4" err || { cat err; fail "$1 x $2: message"; }
    [ ! -e srun.log ] || fail "$1 x $2: srun was started"
done
SLURM_JOB_ID=1 SLURM_JOB_NUM_NODES=64 SLURM_NTASKS_PER_NODE=4 PATH="$tmp/bin:$PATH" bash "$script" > out 2> err ||
    { cat out err; fail "the job of the #SBATCH shape"; }
grep -q '^srun --mpi=pmix .*[ /]moetrain .*qwen3_30b_a3b.nml' srun.log || { cat srun.log; fail "srun line"; }
echo "ok: the job's shape comes from the #SBATCH lines (--check, and a job of another shape stops)"

# gb200_nvl72.sh: 72 trays in 4 racks, placement kept in the NVLink domains
PATH="$tmp/bin:$PATH" MOETRAIN_NAMELISTS="$MT_TOP_SRCDIR/namelists" bash "$MT_TOP_SRCDIR/slurm/gb200_nvl72.sh" --check > out 2> err ||
    { cat out err; fail "gb200_nvl72.sh --check"; }
grep -q 'valid for 288 processes' out && grep -q 'world 288 = TP 4 x CP 1 x PP 4 x DP 18; experts: ETP 1 x EP 8 x EDP 9' out ||
    { cat out; fail "gb200_nvl72.sh --check output"; }
echo "ok: gb200_nvl72.sh --check for 288 processes"
