#!/bin/sh
# moetrain: gfortran as the oracle for the namelist parser: every ok fixture
# must read the same in gfortran, every bad one must fail in gfortran too,
# except those listed below.  The work is in conformance.py.

# ok fixtures that gfortran 12 reads differently or rejects.
#   comma_next_line: gfortran reads a null between a value and a comma that
#     starts the next line; blanks around a comma are part of the separator
#     and an end of record is a blank (F2018 13.10.2, value separators).
#   comment_after_comma: likewise after a comma and a comment; a comment
#     ends the record like a line end (F2018 13.11.3.6, namelist comments).
#   comment_after_equals: gfortran rejects a comment between '=' and the
#     first value (the standard puts comments after value separators);
#     moetrain takes comments anywhere outside strings.
#   index_open_stride: gfortran rejects a(1::2) ("Bad index triplet"), a
#     valid section in the standard.
OK_SKIP="comma_next_line comment_after_comma comment_after_equals index_open_stride"

# bad fixtures gfortran 12 accepts, where moetrain is stricter on purpose.
#   string_multiline: gfortran continues a string on the next line; moetrain
#     wants it closed on its line, so a missing quote is reported where it is
#     rather than at the end of the file.
#   non_utf8: gfortran copies any byte into a string; moetrain requires UTF-8
#     text, so messages and carets are exact and a Latin-1 file is not
#     silently misread.
#   nul_byte: gfortran reads a NUL as a blank; in a text file it is corruption.
#   semicolon: gfortran 12 takes ';' as a separator with DECIMAL='POINT'; the
#     standard makes it one only with DECIMAL='COMMA' (F2018 13.10.2).
#   too_many_for_element: gfortran stores a(3) = 1, 2 into a(3) and a(4); the
#     standard allows one value for an array element.
#   real_overflow: gfortran stores 1e999 as Infinity; no moetrain key wants it.
#   stray_end: gfortran skips '&end' between groups as text; it is usually a
#     doubled closer or a misspelt group, so moetrain reports it.
#   bare_word: gfortran, like the standard, reads any word that starts with t
#     or f as a logical (l = fast is false); moetrain takes only T, F, true,
#     false and the dotted forms, so a typo or an unquoted string is an error.
#   complex: gfortran reads complex variables; moetrain has none.
#   substring: gfortran reads s(1)(2:3) = 'ab' into part of a string; no
#     moetrain key is set by parts.
STRICTER="bare_word string_multiline non_utf8 nul_byte semicolon too_many_for_element real_overflow stray_end complex substring"

if test -z "$GFORTRAN"; then
  echo "SKIP: no gfortran (configure found none)"
  exit 77
fi
python=${PYTHON3:-python3}
if ! command -v "$python" >/dev/null 2>&1; then
  echo "SKIP: no python3 to generate the Fortran readers"
  exit 77
fi
top_srcdir=${MT_TOP_SRCDIR:-$(cd "$(dirname "$0")/../.." && pwd)}
top_builddir=${MT_TOP_BUILDDIR:-.}
dump=$top_builddir/tests/nml/nml_dump
if ! test -x "$dump"; then
  echo "FAIL: $dump not built (make tests/nml/nml_dump)"
  exit 1
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/nml-conformance.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT

"$python" "$top_srcdir/tests/nml/conformance.py" \
  --fixtures "$top_srcdir/tests/fixtures/nml" --dump "$dump" --gfortran "$GFORTRAN" \
  --tmp "$tmp" --ok-skip "$OK_SKIP" --stricter "$STRICTER"
