/* moetrain: error codes and messages.
 *
 * Library functions return 0 on success or a negative MT_E* code, and fill a
 * caller-provided struct mt_err with one human-readable message (which may span
 * several lines: "file:line:col: error: ...", the source line, a caret, a hint).
 * Only the CLI decides to print and exit. */
#ifndef MT_UTIL_ERROR_H
#define MT_UTIL_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" { /* C++ callers: the emulator and its tests */
#endif

enum {
    MT_OK = 0,
    MT_EINVAL = -1,      /* bad user input: namelist, CLI, layout */
    MT_ENOMEM = -2,      /* allocation failed */
    MT_EIO = -3,         /* file system / OS error */
    MT_ECORRUPT = -4,    /* data or checkpoint file is malformed */
    MT_EUNSUPPORTED = -5,/* valid request this build cannot do */
    MT_ERUNTIME = -6     /* failure while running (NaN streak, peer died, ...) */
};

#define MT_ERR_MSG_MAX 8192

struct mt_err {
    int code;
    char msg[MT_ERR_MSG_MAX];
};

/* Sets err (if not NULL) and returns code. */
int mt_err_set(struct mt_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prepends "context: " to the message already in err; returns err->code. */
int mt_err_prefix(struct mt_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Sets err from errno: "<what>: <strerror(errno)>"; returns MT_EIO. */
int mt_err_errno(struct mt_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void mt_err_clear(struct mt_err *err);

const char *mt_err_code_name(int code);

/* Propagate an error code: if (expr) fails, return it. */
#define MT_CHECK(expr)                                                         \
    do {                                                                       \
        int mt_check_rc_ = (expr);                                             \
        if (mt_check_rc_ != MT_OK) return mt_check_rc_;                        \
    } while (0)

/* Propagate through a cleanup label: rc must be declared by the caller. */
#define MT_CHECK_GOTO(expr, label)                                             \
    do {                                                                       \
        rc = (expr);                                                           \
        if (rc != MT_OK) goto label;                                           \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
