#!/bin/sh
# The GPU code moetrain carries is what configure was asked for (--with-cuda-arch, as
# `moetrain --version` lists it): every CUDA fat binary in the executable (one per
# kernels/cuda/*.cu with kernels) holds SASS for each sm_NN and PTX for each compute_NN
# of the list, and nothing else, so that a GPU newer than every SASS can compile the
# PTX. Read by tests/gpu/fatbin_list (the architecture number only: the a and f
# suffixes are not compared). Skips (77) in a build without nvcc.
builddir=${MT_TOP_BUILDDIR:-.}
moetrain=${MOETRAIN:-$builddir/moetrain}
fail() { echo "FAIL: $*"; exit 1; }

version=$("$moetrain" --version) || fail "$moetrain --version failed"
archs=$(echo "$version" | sed -n 's/^backends:.* cuda (\([^,)]*\).*/\1/p')
[ -n "$archs" ] || { echo "SKIP: moetrain was built without CUDA"; exit 77; }
want=$(for a in $archs; do echo "$a"; done | sed 's/[af]$//' | sort -u | tr '\n' ' ')
case " $archs " in
*" compute_"*) ;;
*) echo "note: this build has no PTX (--with-cuda-arch=\"$archs\"): GPUs no SASS fits cannot run it" ;;
esac

list=$("$builddir/tests/gpu/fatbin_list" "$moetrain") || { echo "$list"; fail "fatbin_list $moetrain"; }
echo "$list"
n=0
while read -r _ _ _ _ entries; do
    n=$((n + 1))
    got=$(for e in $entries; do echo "$e"; done | sort -u | tr '\n' ' ')
    [ "$got" = "$want" ] || fail "a fat binary holds '$got'; expected '$want' (moetrain --version: $archs)"
done <<END
$list
END
# kernels/cuda: cuda_memory, gemm, grouped_gemm, layers, attention, moe, loss, optim, quant,
# qdq, probe
[ "$n" -ge 11 ] || fail "$n fat binaries in $moetrain; expected one for each of the 11 kernels/cuda/*.cu"
echo "ok: $n fat binaries, each with $want"
