/* Shared libraries loaded at run time (dynlib.h). */
#include "util/dynlib.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "util/error.h"

int mt_dynlib_load(const char *soname, const char *what, const char *dirs, const char *fix,
                   struct mt_dynlib_sym *syms, size_t nsyms, struct mt_err *err)
{
    char tried[2048];
    const char *e = NULL;
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) e = dlerror();
    int at = snprintf(tried, sizeof tried, "%s", e ? e : "");
    /* dirs: "a:b:c"; each entry tried as dir/soname */
    for (const char *d = dirs ? dirs : ""; !h && *d;) {
        size_t len = strcspn(d, ":");
        if (len > 0) {
            char path[1024];
            snprintf(path, sizeof path, "%.*s/%s", (int)len, d, soname);
            h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (!h && at < (int)sizeof tried)
                at += snprintf(tried + at, sizeof tried - (size_t)at, "; %s", dlerror());
        }
        d += len + (d[len] == ':');
    }
    if (!h)
        return mt_err_set(err, MT_EUNSUPPORTED,
                          "cannot load %s (%s): %s. %s", soname, what, tried, fix);
    for (size_t i = 0; i < nsyms; i++) {
        dlerror();
        syms[i].addr = dlsym(h, syms[i].name);
        if (!syms[i].addr)
            return mt_err_set(err, MT_EUNSUPPORTED,
                              "%s (%s) has no %s: it is older than the one this moetrain was "
                              "built against; load the version configure found, or rebuild",
                              soname, what, syms[i].name);
    }
    return MT_OK;
}
