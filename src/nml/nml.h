/* moetrain: a generic parser for Fortran namelist files.
 *
 * Reads what gfortran's list-directed namelist input reads (doc/architecture.md, section 2)
 * into a tree of groups, assignments and values, keeping each value's lexical
 * type.  It knows nothing of moetrain's keys: the config module maps the tree
 * onto its schema, checks types and bounds, and applies later-wins.
 *
 * Accepted: `&grp ... /`, `&grp ... &end`, `$grp ... $end` (any of the three
 * closers after either opener), names in any case (stored lower-case), `!`
 * comments outside strings, `r*c` repeats and `r*` nulls, null values
 * (`a = 1, , 3`), indices `a(3)`, sections `a(2:6:2)`, `a(2:)`, `a(:4)`, `a(:)`,
 * derived-type components `a%b`, values across lines, blanks or commas between
 * values, several groups per file, and text between groups (ignored).
 *
 * Stricter than gfortran, on purpose (each with a message saying what to do):
 *   - the input must be UTF-8 text without NUL or control characters;
 *   - a string must close on the line where it opens;
 *   - `;` is not a separator: the standard makes it one only in DECIMAL='COMMA'
 *     mode (F2018 13.10.2), though gfortran 12 accepts it in POINT mode too;
 *   - `a(3) = 1, 2` is an error (gfortran stores 2 in a(4));
 *   - logicals are `T`, `F`, `true`, `false`, and `.t` or `.f` followed by
 *     letters or dots (`.true.`, `.tru`), in any case; another word starting
 *     with t or f (`fast`) is an error, not a logical;
 *   - reals that overflow to infinity, `inf` and `nan` are errors;
 *   - between groups, every `&` or `$` (outside a `!` comment) must open a
 *     group: a stray `&end` is an error;
 *   - negative indices, multi-dimensional indices, components of array
 *     elements (`a(1)%b`), substrings and complex values are rejected.
 * Where gfortran 12 departs from the standard, this parser follows the
 * standard: `a = 1` + newline + `, 3`, and `a = 1, ! comment` + newline + `3`,
 * give two values (gfortran reads a null between), and `a(1::2)` is a section
 * (gfortran rejects it).  A comment may also stand between `=` and the first
 * value (gfortran rejects that).  tests/nml/conformance.sh checks all of this
 * against gfortran.
 *
 * Limits: 256 MiB of input, 1,000,000 values in one assignment and 2,000,000 in
 * one file after repeat counts are expanded.  Parsing is linear in the input. */
#ifndef MT_NML_NML_H
#define MT_NML_NML_H

#include <stdbool.h>
#include <stddef.h>

#include "util/error.h"

#define MT_NML_MAX_INPUT ((size_t)256 << 20)
#define MT_NML_MAX_VALUES_PER_ASSIGN 1000000
#define MT_NML_MAX_VALUES_PER_FILE 2000000

enum mt_nml_type { MT_NML_NULL, MT_NML_INT, MT_NML_REAL, MT_NML_LOGICAL, MT_NML_STRING };

/* One value.  Only the field of its type is meaningful, except that an INT also
 * holds (double)i in r.  A NULL value (`a = 1, , 3`, `2*`) leaves the element
 * it lands on unchanged.  s is owned by the file and may be shared by the
 * values of one repeat (`3*'x'`): never free or modify it.  line and col
 * (1-based, col counts bytes) locate the value, or its repeat count. */
struct mt_nml_value {
    enum mt_nml_type type;
    long long i;
    double r;
    bool l;
    char *s;   /* NUL-terminated, quotes removed, doubled quotes collapsed */
    int line, col;
};

/* One assignment `name[(index)] = v1, v2, ...` after repeat counts are expanded
 * (3*1 -> three values; 2* -> two NULL values).  Values fill successive
 * elements: value k (0-based) goes to index start + k*stride.
 *   a         !has_index, start = 1, end = -1, stride = 1
 *   a(3)      has_index, start = end = 3, stride = 1 (at most one value)
 *   a(2:6:2)  start = 2, end = 6, stride = 2 (at most 3 values)
 *   a(2:)     end = -1: open, up to the array's upper bound
 *   a(:4)     start = 1 (arrays here are 1-based)
 *   a(6:2:-2) a negative stride always has an explicit start and end, start >= end
 * Indices are >= 0 (bounds are the consumer's to check); a section is never
 * empty.  nvalues is 0 for `a = /` or `a = b = 1` (gfortran leaves a unchanged). */
struct mt_nml_assign {
    char *name;   /* lower-case, may contain '%' (derived-type component) */
    bool has_index;
    long long start, end, stride;
    size_t nvalues;
    struct mt_nml_value *values;
    int line, col;   /* of the name */
};

struct mt_nml_group {
    char *name;   /* lower-case, without the '&' or '$' */
    size_t nassign;
    struct mt_nml_assign *assigns;
    int line, col;   /* of the '&' or '$' */
};

/* A parsed file.  Groups appear in file order; a group that appears twice is
 * listed twice (the consumer applies later-wins).  The fields after groups are
 * private to nml.c. */
struct mt_nml_file {
    char *path;   /* as given: the path, or parse_string's display name */
    size_t ngroups;
    struct mt_nml_group *groups;
    char *src;       /* private: copy of the input, for error lines */
    size_t src_len;  /* private */
    char *pool;      /* private: names and strings */
};

/* Reads and parses the namelist file at path.  On success sets *out (free it
 * with mt_nml_free) and returns MT_OK.  Otherwise *out is NULL and err holds
 * one message: MT_EIO "path: cannot read namelist file: <strerror>" (missing
 * file, directory, ...), MT_EINVAL for malformed input (see
 * mt_nml_parse_string), MT_ENOMEM. */
int mt_nml_parse_file(const char *path, struct mt_nml_file **out, struct mt_err *err);

/* Parses len bytes of text (NUL bytes in it are an error, not an end); messages
 * name display_name (NULL: "<string>").  On success sets *out and returns
 * MT_OK.  On malformed input returns MT_EINVAL with exactly one error in err,
 * "name:line:col: error: <what>", then the source line and a caret under col
 * (see mt_nml_error_at); an input with no group is the error "no namelist group
 * found".  Returns MT_ENOMEM if memory runs out. */
int mt_nml_parse_string(const char *display_name, const char *text, size_t len,
                        struct mt_nml_file **out, struct mt_err *err);

/* Frees f and everything it owns.  NULL is a no-op. */
void mt_nml_free(struct mt_nml_file *f);

/* Formats an error located in f into err and returns code:
 *   path:line:col: error: <printf(fmt, ...)>
 *    <source line>
 *    <caret under col>
 * Both source and caret lines start with one blank.  Bytes that are not
 * printable UTF-8 show as '?'; a long line is cut to a window around col, with
 * "..." where it was cut.  The config module uses this for type, range and
 * unknown-key errors, with the line and col of a value, assignment or group. */
int mt_nml_error_at(const struct mt_nml_file *f, int line, int col, struct mt_err *err,
                    int code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

#endif
