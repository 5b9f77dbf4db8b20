#!/bin/sh
# The model against an independent JAX autodiff reference (tests/model/jax_ref.py):
# for each case, model_dump writes a tiny model's params, tokens, C losses and C
# gradients; jax_ref.py recomputes them with jax.grad and compares (1e-5 relative,
# norm-based per tensor). Installs CPU JAX with pip when it is missing; skips (77)
# when it cannot.
srcdir=${MT_TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
builddir=${MT_TOP_BUILDDIR:-.}
py=${PYTHON3:-python3}
dump=$builddir/tests/model/model_dump

if ! command -v "$py" >/dev/null 2>&1; then
    echo "SKIP: no python3"; exit 77
fi
if ! "$py" -c 'import jax' >/dev/null 2>&1; then
    echo "installing jax (CPU) with pip ..."
    "$py" -m pip install --quiet --disable-pip-version-check jax >/dev/null 2>&1 ||
        "$py" -m pip install --quiet --disable-pip-version-check --user jax >/dev/null 2>&1
    if ! "$py" -c 'import jax' >/dev/null 2>&1; then
        echo "SKIP: jax is not installed and 'pip install jax' failed"; exit 77
    fi
fi
if [ ! -x "$dump" ]; then
    echo "FAIL: $dump not built"; exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/mt-jax.XXXXXX") || exit 1
trap 'rm -rf "$work"' EXIT
status=0
dirs=
for case in softmax_aux softmax_pre_seq_tied sigmoid_bias forced_capacity dense; do
    mkdir -p "$work/$case"
    if ! "$dump" "$case" "$work/$case"; then
        echo "FAIL: model_dump $case"; status=1; continue
    fi
    dirs="$dirs $work/$case"
done
# one Python process for every case: JAX starts once
# shellcheck disable=SC2086
JAX_PLATFORMS=cpu "$py" "$srcdir/tests/model/jax_ref.py" $dirs || status=1
exit $status
