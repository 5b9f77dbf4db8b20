#!/bin/sh
# The CUDA emulator's exact extents (tests/gpu/emu_memory.cc): copies past the bytes
# requested of cudaMalloc or handed out by the caching allocator, and copies of a block
# back in its cache, are errors in every build; a kernel reading past its extent
# (inside the 256-byte rounding or the size class) or reading a cached block is
# reported by AddressSanitizer, so those cases run only in a build with
# --enable-sanitizers (CI's sanitizer leg) and are listed as not run elsewhere.
prog="${MT_TOP_BUILDDIR:-.}/tests/gpu/emu_memory"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
asan=$("$prog" --asan) || { echo "FAIL: $prog --asan"; exit 1; }

failed=0
"$prog" ok > "$tmp/out" 2>&1 && echo "ok: ok" ||
    { echo "FAIL: ok: correct code must run"; sed 's/^/    /' "$tmp/out"; failed=$((failed + 1)); }

# CASE|needs ASan|message
cases='
class_copy|no|moetrain CUDA emulator: error: cudaMemcpy (source): 1024 bytes at 0x[0-9a-f]* leave the 1000-byte allocation
cached_copy|no|moetrain CUDA emulator: error: cudaMemcpy (source): 0x[0-9a-f]* is in a 1024-byte block that the caching allocator holds free (used after free)
rounding_read|yes|AddressSanitizer: use-after-poison
class_read|yes|AddressSanitizer: use-after-poison
cached_read|yes|AddressSanitizer: use-after-poison
'
echo "$cases" | while IFS='|' read -r name needs message; do
    [ -n "$name" ] || continue
    if [ "$needs" = yes ] && [ "$asan" != yes ]; then
        echo "not run: $name (needs a build with --enable-sanitizers)"
        continue
    fi
    "$prog" "$name" > "$tmp/out" 2>&1
    status=$?
    if [ $status -ne 0 ] && grep -q -e "$message" "$tmp/out" &&
        { [ "$needs" = no ] || grep -q 'read_kernel' "$tmp/out"; }; then
        echo "ok: $name"
    else
        echo "FAIL: $name: exit status $status, expected: $message"
        sed 's/^/    /' "$tmp/out"
        echo x >> "$tmp/failed"
    fi
done
[ -f "$tmp/failed" ] && failed=$((failed + $(wc -l < "$tmp/failed")))
[ $failed -eq 0 ]
