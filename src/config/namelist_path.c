/* Where a namelist named on the command line is: the path itself, else the shipped
 * namelists ($MOETRAIN_NAMELISTS, then the installed $(pkgdatadir)/namelists). */
#include "config/config.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The installed namelists seen from the running executable: the way from MT_BINDIR to
 * MT_PKGDATADIR taken from the directory /proc/self/exe is in, so that an installation
 * moved elsewhere (staged with DESTDIR, a relocated package) finds its own namelists.
 * Empty when the executable's path cannot be read. */
static void namelists_beside_exe(char *out, size_t len)
{
    out[0] = '\0';
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) return;
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (!slash) return;
    *slash = '\0';
    const char *b = MT_BINDIR, *d = MT_PKGDATADIR;
    size_t common = 0; /* the shared leading directories end here */
    for (size_t i = 0;; i++) {
        const bool b_end = b[i] == '\0' || b[i] == '/', d_end = d[i] == '\0' || d[i] == '/';
        if (b_end && d_end) common = i;
        if (b[i] != d[i] || b[i] == '\0') break;
    }
    int at = snprintf(out, len, "%s", exe);
    for (const char *p = b + common; *p && at < (int)len; p++)
        if (*p == '/' && p[1] && p[1] != '/') at += snprintf(out + at, len - (size_t)at, "/..");
    if (at < (int)len) snprintf(out + at, len - (size_t)at, "%s/namelists", d + common);
}

static bool readable_file(const char *path)
{
    return access(path, R_OK) == 0;
}

int mt_config_find_namelist(const char *name, char *path, size_t len, struct mt_err *err)
{
    snprintf(path, len, "%s", name);
    if (name[0] == '/' || access(name, F_OK) == 0) return MT_OK;
    /* "namelists/x.nml", as the docs write it from the source tree, is "x.nml" there */
    const char *base = strncmp(name, "namelists/", 10) == 0 ? name + 10 : name;
    char beside[PATH_MAX];
    namelists_beside_exe(beside, sizeof beside);
    const char *env = getenv("MOETRAIN_NAMELISTS");
    const char *dirs[] = { env && *env ? env : NULL, beside[0] ? beside : NULL,
                           MT_PKGDATADIR "/namelists" };
    char looked[2048] = "";
    int at = 0;
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        if (!dirs[i]) continue;
        bool seen = false; /* the installed directory twice (not relocated) */
        for (size_t j = 0; j < i; j++) seen |= dirs[j] && strcmp(dirs[j], dirs[i]) == 0;
        if (seen) continue;
        snprintf(path, len, "%s/%s", dirs[i], base);
        if (readable_file(path)) return MT_OK;
        if (at < (int)sizeof looked)
            at += snprintf(looked + at, sizeof looked - (size_t)at, "%s%s", at ? ", " : "", path);
    }
    snprintf(path, len, "%s", name);
    return mt_err_set(err, MT_EIO,
                      "%s: cannot read namelist file: no such file, and no %s among the shipped "
                      "namelists (looked for %s; $MOETRAIN_NAMELISTS is %s). Give the file's "
                      "path, or set MOETRAIN_NAMELISTS to a directory of namelists "
                      "('module load moetrain' sets it to the installed ones)",
                      name, base, looked, env && *env ? "set" : "not set");
}
