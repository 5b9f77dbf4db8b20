#!/bin/bash
# The installed moetrain runs where CUDA is not: it names no CUDA library (cudart is
# linked statically, cuBLASLt and NCCL are loaded by a GPU run only), so on a node
# without the CUDA libraries and driver --version, --help-config, --check of a shipped
# namelist by name, topo --dry-run and CPU training work, and --backend cuda ends with
# one message naming the library it cannot load. The node is made in a private mount
# namespace: every CUDA library of the ld.so cache and the toolkit directories
# configure found are covered by empty ones. Skips (77) for a build without CUDA, and
# when mount namespaces are refused (after the NEEDED check, which always runs).
. "$MT_TOP_SRCDIR/tests/runtime/common.sh"
inst=$tmp/inst
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$MT_TOP_BUILDDIR" install prefix="$inst" \
    > "$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; fail "make install"; }
bin=$inst/bin/moetrain
[ -x "$bin" ] || fail "make install wrote no $bin"

cuda_re='lib(cuda|cudart|cublas|cublasLt|nccl)\.so'
needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
echo "$needed" | grep -E "$cuda_re" &&
    fail "the installed moetrain needs CUDA libraries at start-up (readelf -d NEEDED above)"
grep -q '^#define HAVE_CUDA 1' "$MT_TOP_BUILDDIR/config.h" || skip "built without CUDA"

# What a node without CUDA lacks: the libraries in the ld.so cache, the toolkit dirs.
hide=$(ldconfig -p | sed -n 's/.* => //p' | grep -E "/$cuda_re" | sort -u | tr '\n' ' ')
for d in $(sed -n 's/^#define MT_\(CUDA\|NCCL\)_LIBDIRS "\(.*\)"/\2/p' "$MT_TOP_BUILDDIR/config.h" | tr : ' '); do
    [ -d "$d" ] && hide="$hide $(cd "$d/.." && pwd -P)"
done
mkdir "$tmp/empty" "$tmp/run"
unshare -m true 2> /dev/null || skip "mount namespaces are refused here (unshare -m): no CUDA-less node to run on"

# The checks, in the namespace, from a directory outside the source tree.
cat > "$tmp/node.sh" << EOS
set -u
for p in $hide; do
    if [ -d "\$p" ]; then mount --bind "$tmp/empty" "\$p"; else mount --bind /dev/null "\$p"; fi || exit 3
done
cd "$tmp/run"
unset MOETRAIN_NAMELISTS
ok() { "\$@" > out 2> err || { echo "FAIL: \$* exited \$?"; cat out err; exit 1; }; }
ok "$bin" --version
grep -q '^  cuBLASLt .*not loadable' out || { cat out; echo "FAIL: cuBLASLt still loadable: the node was not made"; exit 1; }
ok "$bin" --help-config
ok "$bin" --check --world-size 2 namelists/tiny_moe.nml parallel%expert_model_parallel_size=2
ok "$bin" topo --dry-run --nodes-file "$MT_TOP_SRCDIR/tests/fixtures/topo/nvl72-4racks.nodes" \
    --gpus-per-node 4 qwen3_30b_a3b.nml parallel%tensor_model_parallel_size=4 \
    parallel%sequence_parallel=.true. parallel%expert_tensor_parallel_size=1 \
    parallel%expert_model_parallel_size=8
ok "$bin" --backend cpu namelists/tiny_moe.nml data%mock_data=.true. training%train_iters=2 training%eval_iters=1 \
    optimizer%lr_warmup_iters=1 logging%log_interval=1
grep -q 'backend cpu' out && grep -q 'iteration  *2/' out || { cat out; echo "FAIL: no CPU training step"; exit 1; }
"$bin" --backend cuda namelists/tiny_moe.nml "precision%params_dtype='bf16'" > out 2> err &&
    { echo "FAIL: --backend cuda ran without CUDA"; exit 1; }
[ "\$(grep -c 'error' err)" = 1 ] && grep -q 'error: --backend cuda: cannot load libcublasLt\.so\.[0-9]*' err &&
    grep -q 'LD_LIBRARY_PATH' err || { cat err; echo "FAIL: --backend cuda did not name the missing cuBLASLt once"; exit 1; }
echo "ok: no CUDA: --version, --help-config, --check and topo by shipped name, CPU steps; --backend cuda: \$(cat err)"
EOS
unshare -m --propagation private bash "$tmp/node.sh" || fail "on a node without CUDA (above)"

# With CUDA but no driver (this machine, unless it has a GPU): the driver is named.
if ! ldconfig -p | grep -q 'libcuda\.so\.1 '; then
    cd "$tmp/run"
    "$bin" --backend cuda namelists/tiny_moe.nml "precision%params_dtype='bf16'" > out 2> err &&
        fail "--backend cuda ran without a driver"
    grep -q 'error: --backend cuda: cannot load libcuda\.so\.1 (the NVIDIA driver' err ||
        { cat err; fail "--backend cuda did not name the missing driver"; }
    echo "ok: no driver: $(cat err)"
fi
