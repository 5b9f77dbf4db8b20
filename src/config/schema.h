/* moetrain: the schema table — every namelist group and key, in one place.
 *
 * Each row binds `&group key` to a field of struct mt_config with its type,
 * default, allowed range or values, and a one-line doc. The loader, the
 * printer (--print-config), --help-config and the man page all read this table. */
#ifndef MT_CONFIG_SCHEMA_H
#define MT_CONFIG_SCHEMA_H

#include <stddef.h>

enum mt_key_type {
    MT_KEY_INT,
    MT_KEY_REAL,
    MT_KEY_BOOL,
    MT_KEY_ENUM,         /* string from a fixed set, stored in canonical spelling */
    MT_KEY_STRING,
    MT_KEY_INT_ARRAY,    /* int array with a length field */
    MT_KEY_STRING_ARRAY  /* char[n][MT_STR_MAX] with a length field */
};

struct mt_key {
    const char *group;
    const char *name;
    enum mt_key_type type;
    size_t offset;      /* of the field in struct mt_config */
    size_t size;        /* string capacity, or array capacity in elements */
    size_t len_offset;  /* arrays: offset of the int length field */
    long long idef;     /* INT, BOOL, INT_ARRAY (fill value) default */
    double rdef;        /* REAL default */
    const char *sdef;   /* ENUM, STRING default */
    long long imin, imax;
    double rmin, rmax;
    const char *choices; /* ENUM: "a|b|c" */
    const char *doc;
};

/* The table, NULL-name terminated. */
extern const struct mt_key mt_schema[];

/* Distinct group names in table order, NULL terminated. */
extern const char *const mt_schema_groups[];

const struct mt_key *mt_schema_find(const char *group, const char *name);

const char *mt_key_type_name(enum mt_key_type t);

#endif
