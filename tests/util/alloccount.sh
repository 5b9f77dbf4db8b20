# Sourced by the host-overhead tests: shim is the allocation-counting library
# (tests/util/alloc_count.c) that they preload; skips (77) when moetrain is built with
# a sanitizer, whose allocator the counting library cannot replace.
shim="$MT_TOP_BUILDDIR/tests/util/libmt_alloccount.so"
[ -r "$shim" ] || { echo "FAIL: no $shim (make check builds it)"; exit 1; }
if ldd "$MOETRAIN" 2>/dev/null | grep -q 'libasan\|libtsan\|libmsan' ||
   nm "$MOETRAIN" 2>/dev/null | grep -q '__asan_init\|__tsan_init'; then
    echo "SKIP: moetrain is built with a sanitizer, whose allocator the counting library cannot replace"
    exit 77
fi
