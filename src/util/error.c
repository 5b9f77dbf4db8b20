#include "util/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int mt_err_set(struct mt_err *err, int code, const char *fmt, ...)
{
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

int mt_err_prefix(struct mt_err *err, const char *fmt, ...)
{
    if (!err) return MT_EINVAL;
    char ctx[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    char old[MT_ERR_MSG_MAX];
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", ctx, old);
    return err->code;
}

int mt_err_errno(struct mt_err *err, const char *fmt, ...)
{
    int saved = errno;
    if (!err) return MT_EIO;
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    err->code = MT_EIO;
    snprintf(err->msg, sizeof err->msg, "%s: %s", what, strerror(saved));
    return MT_EIO;
}

void mt_err_clear(struct mt_err *err)
{
    if (!err) return;
    err->code = MT_OK;
    err->msg[0] = '\0';
}

const char *mt_err_code_name(int code)
{
    switch (code) {
    case MT_OK: return "ok";
    case MT_EINVAL: return "invalid input";
    case MT_ENOMEM: return "out of memory";
    case MT_EIO: return "I/O error";
    case MT_ECORRUPT: return "corrupt file";
    case MT_EUNSUPPORTED: return "unsupported";
    case MT_ERUNTIME: return "runtime error";
    default: return "unknown error";
    }
}
