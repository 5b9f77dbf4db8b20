/* moetrain tests: a parsed namelist flattened to one line per array element,
 * after later-wins, the form of the fixtures' .expect files:
 *
 *   group.key(i) = int 3
 *   group.key(i) = real 0.10000000000000001     (%.17g)
 *   group.key(i) = logical T                    (or F)
 *   group.key(i) = str 'it''s'                  (quotes doubled)
 *   group.key(i) = null                         (named, but only with null values)
 *
 * An assignment without an index starts at element 1.  A later non-null value
 * replaces an earlier one, also across repeated groups; a null never does.
 * Lines are sorted by group, then key (strcmp), then index. */
#ifndef MT_TESTS_NML_FLATTEN_H
#define MT_TESTS_NML_FLATTEN_H

#include <stdio.h>

#include "nml/nml.h"

/* Writes the flattened lines of f to out; returns 0, or -1 if out of memory. */
int nml_flatten(const struct mt_nml_file *f, FILE *out);

/* The flattened lines of f as one malloc'd string (NULL if out of memory). */
char *nml_flatten_string(const struct mt_nml_file *f);

#endif
