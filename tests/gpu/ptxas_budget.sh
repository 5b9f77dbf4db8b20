#!/bin/sh
# The register budget of the CUDA kernels: every kernels/cuda/*.cu compiled by ptxas
# (-Xptxas -v) for each SASS architecture of this build (sm_NN of --with-cuda-arch;
# PTX is compiled by the driver, ptxas says nothing of it), and each kernel's
# registers, spill stores and loads and stack frame held against
# kernels/cuda/ptxas-budget.txt. Prints the table (kernel, arch, registers, spill
# bytes, stack, static shared memory; dynamic shared memory is the launch's, not
# ptxas's). Fails naming every kernel over its budget. Skips (77) in a build without
# nvcc.
#   MT_PTXAS_TABLE=FILE  also writes the table there (a figure for the docs)
srcdir=${MT_TOP_SRCDIR:-.}
builddir=${MT_TOP_BUILDDIR:-.}
budget="$srcdir/kernels/cuda/ptxas-budget.txt"
fail() { echo "FAIL: $*"; exit 1; }

# nvcc and the GPU code configure chose, as the build uses them
nvcc=$(sed -n 's/^NVCC = //p' "$builddir/Makefile")
gencode=$(sed -n 's/^NVCC_GENCODE = //p' "$builddir/Makefile")
[ -n "$nvcc" ] || { echo "SKIP: this build has no nvcc (configure --with-cuda)"; exit 77; }
archs=$(echo "$gencode" | tr ' ' '\n' | sed -n 's/^arch=\(compute_[0-9a-z]*\),code=sm_\([0-9a-z]*\)$/\1,\2/p')
[ -n "$archs" ] || { echo "SKIP: no SASS in this build (NVCC_GENCODE='$gencode'): PTX only"; exit 77; }
[ -r "$budget" ] || fail "cannot read $budget"

tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
for cu in "$srcdir"/kernels/cuda/*.cu; do
    for a in $archs; do
        sm=sm_${a#*,}
        # -cubin: the device compilation alone, as in the build (-O3, the same headers)
        "$nvcc" -std=c++17 -O3 -lineinfo -cubin -gencode "arch=${a%,*},code=$sm" -Xptxas -v \
            -I"$srcdir/src" -I"$srcdir" -I"$builddir" -o "$tmp/k.cubin" "$cu" > "$tmp/log" 2>&1 ||
            { cat "$tmp/log"; fail "nvcc -cubin $cu for $sm"; }
        # entry functions only: name, arch, registers, spill stores+loads, stack, smem
        awk -v file="${cu##*/}" '
            /Compiling entry function/ { split($0, q, "'\''"); name = q[2]; arch = q[4]; entry = 1; next }
            /Function properties for/ { if (!entry) name = "" ; entry = 0; next }
            name != "" && /bytes stack frame/ { stack = $1; spill = $5 + $9 }
            name != "" && /Used [0-9]+ registers/ {
                regs = $0; sub(/.*Used /, "", regs); sub(/ registers.*/, "", regs)
                smem = 0; if (match($0, /[0-9]+ bytes smem/)) smem = substr($0, RSTART, RLENGTH) + 0
                print name, arch, regs, spill, stack, smem, file; name = "" }' "$tmp/log" >> "$tmp/raw"
    done
done
[ -s "$tmp/raw" ] || fail "ptxas reported no kernel"

# demangled names without the parameter list: att_dkdv_kernel<128>; cub's (the radix
# sort of cuda_moe.cu) as cub::KERNEL, its template arguments left out
cut -d' ' -f1 "$tmp/raw" | c++filt 2>/dev/null |
    sed 's/^void //; s/^\(cub::\)[^<]*::\([A-Za-z0-9_]*\)<.*/\1\2/; s/(.*$//; s/ /_/g' > "$tmp/names" &&
    [ "$(wc -l < "$tmp/names")" -eq "$(wc -l < "$tmp/raw")" ] || cut -d' ' -f1 "$tmp/raw" > "$tmp/names"
# one row per kernel, arch and figures (cuda_common.cuh's mt_iota_kernel is in every file)
paste -d' ' "$tmp/names" "$tmp/raw" | cut -d' ' -f1,3- | sort -k1,1 -k2,2 -k3,3n -k4,4n | sort -u -k1,6 > "$tmp/table"

# each kernel against the first budget line whose pattern matches its name
status=0
{
    printf '%-52s %-7s %5s %6s %6s %6s  %s\n' kernel arch regs spill stack smem budget
    while read -r name arch regs spill stack smem file; do
        line=$(grep -v '^[[:space:]]*#' "$budget" | while read -r pat maxr maxs maxst rest; do
            [ -n "$pat" ] || continue
            # shellcheck disable=SC2254
            case "$name" in $pat) echo "$pat $maxr $maxs $maxst"; break ;; esac
        done)
        [ -n "$line" ] || { echo "FAIL: $name ($file, $arch): no line of ptxas-budget.txt matches it" >&2; status=1; continue; }
        set -f # the pattern is not a file name
        set -- $line
        set +f
        printf '%-52s %-7s %5s %6s %6s %6s  %s\n' "$name" "$arch" "$regs" "$spill" "$stack" "$smem" \
            "<= $2 regs, $3 spill, $4 stack ($1)"
        over=""
        [ "$regs" -le "$2" ] || over="$over registers $regs > $2;"
        [ "$spill" -le "$3" ] || over="$over spill $spill bytes > $3;"
        [ "$stack" -le "$4" ] || over="$over stack $stack bytes > $4;"
        # 255 is ptxas's cap: a kernel there has no room left and spills on any change
        [ "$regs" -lt 255 ] || over="$over at the 255-register cap;"
        [ -z "$over" ] || { echo "FAIL: $name ($file, $arch) over its budget:$over" >&2; status=1; }
    done < "$tmp/table"
} > "$tmp/report" 2> "$tmp/fails"
cat "$tmp/report"
[ -z "${MT_PTXAS_TABLE:-}" ] || cp "$tmp/report" "$MT_PTXAS_TABLE"
[ ! -s "$tmp/fails" ] || cat "$tmp/fails"
[ "$status" -eq 0 ] || exit 1
echo "ok: $(wc -l < "$tmp/table") kernel builds within kernels/cuda/ptxas-budget.txt"
