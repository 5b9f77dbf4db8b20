#!/bin/sh
# --print-config is a namelist gfortran can READ: moetrain prints every shipped
# configuration, gfortran reads it and writes it back with its own namelist
# output, and moetrain reads gfortran's file to exactly the same configuration.
set -u
[ -n "${GFORTRAN:-}" ] || { echo "SKIP: gfortran not found"; exit 77; }
[ -n "${PYTHON3:-}" ] || { echo "SKIP: python3 not found"; exit 77; }
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
status=0
for nml in "$MT_TOP_SRCDIR"/namelists/*.nml; do
    name=$(basename "$nml" .nml)
    "$MOETRAIN" --print-config "$nml" > "$tmp/$name.a.nml" || { echo "FAIL: --print-config $nml"; status=1; continue; }
    "$PYTHON3" "$MT_TOP_SRCDIR/tests/config/fortran_roundtrip.py" "$tmp/$name.a.nml" "$tmp/$name.f90" || { status=1; continue; }
    "$GFORTRAN" -o "$tmp/$name.exe" "$tmp/$name.f90" || { echo "FAIL: gfortran could not compile the reader for $name"; status=1; continue; }
    "$tmp/$name.exe" "$tmp/$name.a.nml" "$tmp/$name.b.nml" || { echo "FAIL: gfortran could not READ moetrain's --print-config of $name"; status=1; continue; }
    "$MOETRAIN" --print-config "$tmp/$name.b.nml" > "$tmp/$name.c.nml" || { echo "FAIL: moetrain could not read gfortran's output for $name"; cat "$tmp/$name.b.nml"; status=1; continue; }
    if cmp -s "$tmp/$name.a.nml" "$tmp/$name.c.nml"; then
        echo "ok: $name round-trips through gfortran"
    else
        echo "FAIL: $name differs after the gfortran round trip"; diff "$tmp/$name.a.nml" "$tmp/$name.c.nml"; status=1
    fi
done
exit $status
