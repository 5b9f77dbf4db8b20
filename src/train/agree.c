/* Ranks agree on what they run: before anything is allocated, every process of a job
 * compares the executable it runs and its resolved configuration with world rank
 * 0's. A job whose processes were started with other namelists or overrides (an MPMD
 * launch, a wrapper script that differs per node) would otherwise train silently with
 * mixed settings, or die later in a collective whose sizes do not match. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "train/train.h"

#define FNV_OFFSET 0xcbf29ce484222325ull

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* The bytes of the running executable, hashed: two builds differ, two copies of one
 * build do not. 0 when it cannot be read (then it is not compared). */
static uint64_t executable_hash(void)
{
    int fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    uint64_t h = FNV_OFFSET;
    char buf[1 << 16];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) h = fnv1a(h, buf, (size_t)n);
    close(fd);
    return n < 0 ? 0 : h;
}

static char *config_text(const struct mt_config *cfg, size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    if (!f) return NULL;
    mt_config_print(cfg, f);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* The next line of *p (without its newline), advancing *p. */
static const char *next_line(const char **p, size_t *len)
{
    const char *s = *p;
    if (!*s) return NULL;
    const char *nl = strchr(s, '\n');
    *len = nl ? (size_t)(nl - s) : strlen(s);
    *p = nl ? nl + 1 : s + *len;
    return s;
}

/* "&group key = value (rank 0: key = value); ..." for the lines of mine that differ
 * from ref's (both printed by the same executable, so line i is the same key). */
static void describe_diff(const char *mine, const char *ref, char *out, size_t cap)
{
    const char *a = mine, *b = ref, *la, *lb;
    size_t na, nb, at = 0;
    char group[64] = "";
    int shown = 0, more = 0;
    out[0] = '\0';
    while ((la = next_line(&a, &na)) && (lb = next_line(&b, &nb))) {
        if (la[0] == '&') snprintf(group, sizeof group, "%.*s", (int)na, la);
        if (na == nb && !memcmp(la, lb, na)) continue;
        while (na && *la == ' ') la++, na--;
        while (nb && *lb == ' ') lb++, nb--;
        if (shown == 8 || at + na + nb + 64 >= cap) {
            more++;
            continue;
        }
        at += (size_t)snprintf(out + at, cap - at, "%s%s %.*s (rank 0: %.*s)",
                               shown ? "; " : "", group, (int)na, la, (int)nb, lb);
        shown++;
    }
    if (more) snprintf(out + at, cap - at, "; and %d more", more);
}

/* "2, 5, 7" for the ranks flagged in bad (at most 16 named). */
static void list_ranks(const bool *bad, int n, char *out, size_t cap)
{
    size_t at = 0;
    int shown = 0, more = 0;
    out[0] = '\0';
    for (int r = 0; r < n; r++) {
        if (!bad[r]) continue;
        if (shown == 16) {
            more++;
            continue;
        }
        at += (size_t)snprintf(out + at, cap - at, "%s%d", shown++ ? ", " : "", r);
    }
    if (more) snprintf(out + at, cap - at, " and %d more", more);
}

int mt_train_agree_config(struct mt_world *w, const struct mt_config *cfg, bool *report,
                          struct mt_err *err)
{
    *report = true;
    if (w->size == 1) return MT_OK;
    size_t len = 0;
    char *text = config_text(cfg, &len);
    if (!text) return mt_err_set(err, MT_ENOMEM, "out of memory for the configuration text");
    int64_t mine[3] = {(int64_t)executable_hash(), (int64_t)len,
                       (int64_t)fnv1a(FNV_OFFSET, text, len)};
    int64_t *all = malloc(sizeof mine * (size_t)w->size);
    bool *bad = calloc((size_t)w->size, sizeof *bad);
    char *ref = NULL;
    int rc = !all || !bad ? mt_err_set(err, MT_ENOMEM, "out of memory") : MT_OK;
    if (rc == MT_OK) rc = mt_all_gather(w->comm, mine, all, 3, MT_DT_I64, err);
    if (rc) goto out;
    int nexe = 0, ncfg = 0;
    for (int r = 0; r < w->size; r++) {
        const int64_t *x = all + 3 * r;
        bad[r] = x[0] && all[0] && x[0] != all[0];
        nexe += bad[r];
    }
    char ranks[256];
    if (nexe) {
        *report = w->rank == 0 || bad[w->rank];
        list_ranks(bad, w->size, ranks, sizeof ranks);
        char exe[1024] = "?";
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        exe[n > 0 ? n : 0] = '\0';
        rc = mt_err_set(err, MT_EINVAL,
                        "rank%s %s of %d run%s another moetrain executable than rank 0 (this "
                        "rank runs %s): every process of a job must run the same build (load "
                        "the same module on every node)",
                        nexe == 1 ? "" : "s", ranks, w->size, nexe == 1 ? "s" : "", exe);
        goto out;
    }
    for (int r = 0; r < w->size; r++) {
        const int64_t *x = all + 3 * r;
        bad[r] = x[1] != all[1] || x[2] != all[2];
        ncfg += bad[r];
    }
    if (!ncfg) goto out;
    /* rank 0's text to every rank, which then names its own differences */
    int64_t rlen = all[1];
    ref = malloc((size_t)rlen + 1);
    if (!ref) {
        rc = mt_err_set(err, MT_ENOMEM, "out of memory");
        goto out;
    }
    if (w->rank == 0) memcpy(ref, text, (size_t)rlen);
    rc = mt_broadcast(w->comm, ref, (size_t)rlen, MT_DT_U8, 0, err);
    if (rc) goto out;
    ref[rlen] = '\0';
    list_ranks(bad, w->size, ranks, sizeof ranks);
    if (bad[w->rank]) {
        char diff[4096];
        describe_diff(text, ref, diff, sizeof diff);
        rc = mt_err_set(err, MT_EINVAL,
                        "this rank was started with another configuration than rank 0: %s. "
                        "Every process of a job must read the same namelists and overrides",
                        diff);
    } else {
        *report = w->rank == 0;
        rc = mt_err_set(err, MT_EINVAL,
                        "rank%s %s of %d %s started with another configuration than rank 0 "
                        "(%s the keys): every process of a job must read the same namelists "
                        "and overrides",
                        ncfg == 1 ? "" : "s", ranks, w->size, ncfg == 1 ? "was" : "were",
                        ncfg == 1 ? "its message names" : "their messages name");
    }
out:
    free(text);
    free(all);
    free(bad);
    free(ref);
    return rc;
}
