/* moetrain: a small JSON reader (RFC 8259) and a string writer, for checkpoint indexes
 * and safetensors headers.
 *
 * mt_json_parse builds a tree of values from a buffer (no NUL needed). Numbers keep
 * their double value and, when written as integers that fit, their exact int64 value.
 * Strings are UTF-8 with escapes decoded (\u surrogate pairs included; an embedded NUL
 * is refused). Malformed input is an error naming the line and column; nesting deeper
 * than MT_JSON_MAX_DEPTH is refused. Duplicate object keys are kept; mt_json_get
 * returns the first. */
#ifndef MT_UTIL_JSON_H
#define MT_UTIL_JSON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "util/error.h"

#define MT_JSON_MAX_DEPTH 64

enum mt_json_type {
    MT_JSON_NULL,
    MT_JSON_BOOL,
    MT_JSON_NUMBER,
    MT_JSON_STRING,
    MT_JSON_ARRAY,
    MT_JSON_OBJECT
};

struct mt_json {
    enum mt_json_type type;
    bool boolean;
    double number;
    bool is_int;          /* number written as an integer that fits int64 */
    long long integer;    /* its value when is_int */
    char *string;         /* STRING: NUL-terminated */
    size_t n;             /* ARRAY, OBJECT: number of items */
    struct mt_json *items;/* ARRAY, OBJECT: values */
    char **keys;          /* OBJECT: keys of items */
};

/* Parses text[0..len) (one value, surrounded by whitespace only) into *out. what names
 * the input in messages ("'DIR/index.json'"). */
int mt_json_parse(const char *text, size_t len, const char *what, struct mt_json **out,
                  struct mt_err *err);
void mt_json_free(struct mt_json *v);

/* The value of key in an object (NULL when v is not an object or has no such key). */
const struct mt_json *mt_json_get(const struct mt_json *v, const char *key);
/* The integer value of v when it is an integer number in [lo, hi]. */
bool mt_json_int(const struct mt_json *v, long long lo, long long hi, long long *out);

/* Writes s as a JSON string (quoted, escaped). */
void mt_json_write_string(FILE *f, const char *s);

#endif
