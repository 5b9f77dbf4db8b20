/* Single-process checkpoints: one self-checking file per iteration directory.
 *
 * DIR/iter_0000100/state.bin   header, tensor table, params, Adam m and v,
 *                              buffers, then an FNV-1a 64 checksum of all before
 * DIR/iter_0000100/config.nml  the resolved configuration (for people)
 * DIR/latest_checkpointed_iteration.txt
 *
 * A save is written to DIR/iter_0000100.tmp, fsynced, and renamed into place;
 * only then does the "latest" file (itself replaced by rename) point to it, so a
 * crash at any moment leaves the previous checkpoint whole and referenced. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "train/train.h"

#define CKPT_MAGIC "MTCKPT01"
#define CKPT_VERSION 1u
#define LATEST_FILE "latest_checkpointed_iteration.txt"

/* ---- a writer that checksums what it writes ---------------------------- */

struct sink {
    FILE *f;
    uint64_t hash;
    bool failed;
};

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static void put(struct sink *s, const void *p, size_t n)
{
    if (s->failed) return;
    s->hash = fnv1a(s->hash, p, n);
    if (n && fwrite(p, 1, n, s->f) != n) s->failed = true;
}

static void put_u64(struct sink *s, uint64_t x) { put(s, &x, sizeof x); }

/* ---- file-system helpers ---------------------------------------------- */

static int fsync_path(const char *path, struct mt_err *err)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return mt_err_errno(err, "checkpoint: cannot open '%s' to sync it", path);
    int rc = fsync(fd);
    close(fd);
    if (rc != 0 && errno != EINVAL)
        return mt_err_errno(err, "checkpoint: fsync of '%s' failed", path);
    return MT_OK;
}

static int mkdir_p(const char *path, struct mt_err *err)
{
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return mt_err_errno(err, "checkpoint: cannot create directory '%s'", buf);
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return mt_err_errno(err, "checkpoint: cannot create directory '%s'", buf);
    return MT_OK;
}

/* Removes a checkpoint directory (only the files a checkpoint holds). */
static void remove_ckpt_dir(const char *dir)
{
    static const char *const files[] = { "state.bin", "config.nml" };
    char path[4096];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    rmdir(dir);
}

static int write_text_file(const char *path, const char *text, struct mt_err *err)
{
    FILE *f = fopen(path, "w");
    if (!f) return mt_err_errno(err, "checkpoint: cannot create '%s'", path);
    bool ok = fputs(text, f) >= 0;
    ok = fflush(f) == 0 && ok;
    ok = fsync(fileno(f)) == 0 && ok;
    ok = fclose(f) == 0 && ok;
    if (!ok) return mt_err_errno(err, "checkpoint: cannot write '%s'", path);
    return MT_OK;
}

static int write_state(const char *path, const struct mt_ckpt_view *v,
                       const struct mt_train_state *st, struct mt_err *err)
{
    FILE *f = fopen(path, "wb");
    if (!f) return mt_err_errno(err, "checkpoint: cannot create '%s'", path);
    struct sink s = { f, 0xcbf29ce484222325ull, false };
    put(&s, CKPT_MAGIC, 8);
    put_u64(&s, CKPT_VERSION);
    put_u64(&s, (uint64_t)st->iteration);
    put_u64(&s, (uint64_t)st->consumed_samples);
    put_u64(&s, (uint64_t)st->eval_count);
    put_u64(&s, (uint64_t)st->skipped_iters);
    put_u64(&s, (uint64_t)st->adam_step);
    put_u64(&s, (uint64_t)v->ntensors);
    put_u64(&s, (uint64_t)v->nparams);
    put_u64(&s, (uint64_t)v->nbuffers);
    for (int i = 0; i < v->ntensors; i++) {
        uint64_t len = strlen(v->names[i]);
        put_u64(&s, len);
        put(&s, v->names[i], len);
        put_u64(&s, (uint64_t)v->ndims[i]);
        for (int d = 0; d < 4; d++) put_u64(&s, (uint64_t)v->shapes[i][d]);
    }
    put(&s, v->params, v->nparams * sizeof(float));
    put(&s, v->adam_m, v->nparams * sizeof(float));
    put(&s, v->adam_v, v->nparams * sizeof(float));
    if (v->nbuffers) put(&s, v->buffers, v->nbuffers * sizeof(float));
    uint64_t sum = s.hash;
    if (!s.failed && fwrite(&sum, sizeof sum, 1, f) != 1) s.failed = true;
    if (!s.failed && (fflush(f) != 0 || fsync(fileno(f)) != 0)) s.failed = true;
    if (fclose(f) != 0) s.failed = true;
    if (s.failed) return mt_err_errno(err, "checkpoint: writing '%s' failed", path);
    return MT_OK;
}

static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return (x > y) - (x < y);
}

/* Keeps the newest keep iter_* directories of dir. */
static void prune(const char *dir, int keep)
{
    DIR *d = opendir(dir);
    if (!d) return;
    long long iters[4096];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 4096) {
        long long it;
        char tail;
        if (sscanf(e->d_name, "iter_%lld%c", &it, &tail) == 1) iters[n++] = it;
    }
    closedir(d);
    qsort(iters, (size_t)n, sizeof iters[0], cmp_ll);
    for (int i = 0; i + keep < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/iter_%07lld", dir, iters[i]);
        remove_ckpt_dir(path);
    }
}

int mt_ckpt_save(const char *dir, const struct mt_ckpt_view *v, const struct mt_train_state *st,
                 const char *config_text, int keep_last, struct mt_err *err)
{
    char final_dir[4096], tmp_dir[4200], old_dir[4200], path[4400];
    MT_CHECK(mkdir_p(dir, err));
    snprintf(final_dir, sizeof final_dir, "%s/iter_%07lld", dir, st->iteration);
    snprintf(tmp_dir, sizeof tmp_dir, "%s.tmp", final_dir);
    snprintf(old_dir, sizeof old_dir, "%s.old", final_dir);
    remove_ckpt_dir(tmp_dir); /* left over from a crash */
    if (mkdir(tmp_dir, 0755) != 0)
        return mt_err_errno(err, "checkpoint: cannot create '%s'", tmp_dir);

    int rc;
    snprintf(path, sizeof path, "%s/state.bin", tmp_dir);
    MT_CHECK_GOTO(write_state(path, v, st, err), fail);
    snprintf(path, sizeof path, "%s/config.nml", tmp_dir);
    MT_CHECK_GOTO(write_text_file(path, config_text, err), fail);
    MT_CHECK_GOTO(fsync_path(tmp_dir, err), fail);

    /* an older save of the same iteration is replaced only once this one is whole */
    struct stat sb;
    bool had_old = stat(final_dir, &sb) == 0;
    if (had_old && rename(final_dir, old_dir) != 0) {
        rc = mt_err_errno(err, "checkpoint: cannot move aside '%s'", final_dir);
        goto fail;
    }
    if (rename(tmp_dir, final_dir) != 0) {
        rc = mt_err_errno(err, "checkpoint: cannot rename '%s' to '%s'", tmp_dir, final_dir);
        goto fail;
    }
    if (had_old) remove_ckpt_dir(old_dir);
    MT_CHECK(fsync_path(dir, err));

    char latest[4200], latest_tmp[4300], text[64];
    snprintf(latest, sizeof latest, "%s/%s", dir, LATEST_FILE);
    snprintf(latest_tmp, sizeof latest_tmp, "%s.tmp", latest);
    snprintf(text, sizeof text, "%lld\n", st->iteration);
    MT_CHECK(write_text_file(latest_tmp, text, err));
    if (rename(latest_tmp, latest) != 0)
        return mt_err_errno(err, "checkpoint: cannot rename '%s'", latest_tmp);
    MT_CHECK(fsync_path(dir, err));
    if (keep_last > 0) prune(dir, keep_last);
    return MT_OK;
fail:
    remove_ckpt_dir(tmp_dir);
    return rc;
}

/* ---- loading ----------------------------------------------------------- */

struct source {
    const unsigned char *p;
    size_t n, off;
    bool short_read;
};

static uint64_t get_u64(struct source *s)
{
    uint64_t x = 0;
    if (s->off + 8 > s->n) {
        s->short_read = true;
        return 0;
    }
    memcpy(&x, s->p + s->off, 8);
    s->off += 8;
    return x;
}

static const void *get_bytes(struct source *s, size_t n)
{
    if (n > s->n || s->off > s->n - n) {
        s->short_read = true;
        return NULL;
    }
    const void *p = s->p + s->off;
    s->off += n;
    return p;
}

static int read_file(const char *path, unsigned char **data, size_t *n, struct mt_err *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return mt_err_errno(err, "checkpoint: cannot open '%s'", path);
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode)) {
        fclose(f);
        return mt_err_set(err, MT_ECORRUPT, "checkpoint: '%s' is not a regular file", path);
    }
    *n = (size_t)sb.st_size;
    *data = malloc(*n ? *n : 1);
    if (!*data) {
        fclose(f);
        return mt_err_set(err, MT_ENOMEM, "checkpoint: no memory to read '%s' (%zu bytes)",
                          path, *n);
    }
    size_t got = fread(*data, 1, *n, f);
    fclose(f);
    if (got != *n) {
        free(*data);
        return mt_err_errno(err, "checkpoint: reading '%s' failed", path);
    }
    return MT_OK;
}

static int corrupt(struct mt_err *err, const char *path, const char *what)
{
    return mt_err_set(err, MT_ECORRUPT,
                      "checkpoint '%s' is corrupt: %s. Load an older checkpoint (set "
                      "checkpoint%%load to its iter_* directory) or start without load",
                      path, what);
}

static int parse_state(const char *path, const unsigned char *data, size_t n,
                       struct mt_ckpt_view *v, struct mt_train_state *st, struct mt_err *err)
{
    if (n < 16 || memcmp(data, CKPT_MAGIC, 8) != 0)
        return corrupt(err, path, "it does not start with the moetrain checkpoint magic");
    uint64_t stored;
    memcpy(&stored, data + n - 8, 8);
    if (fnv1a(0xcbf29ce484222325ull, data, n - 8) != stored)
        return corrupt(err, path, "the checksum does not match (truncated or damaged file)");
    struct source s = { data, n - 8, 8, false };
    uint64_t version = get_u64(&s);
    if (version != CKPT_VERSION)
        return mt_err_set(err, MT_ECORRUPT,
                          "checkpoint '%s' has format version %" PRIu64
                          "; this moetrain reads version %u",
                          path, version, CKPT_VERSION);
    struct mt_train_state t;
    t.iteration = (long long)get_u64(&s);
    t.consumed_samples = (long long)get_u64(&s);
    t.eval_count = (long long)get_u64(&s);
    t.skipped_iters = (long long)get_u64(&s);
    t.adam_step = (long long)get_u64(&s);
    uint64_t ntensors = get_u64(&s), nparams = get_u64(&s), nbuffers = get_u64(&s);
    if (s.short_read) return corrupt(err, path, "the header is truncated");
    if (ntensors != (uint64_t)v->ntensors || nparams != v->nparams || nbuffers != v->nbuffers)
        return mt_err_set(err, MT_EINVAL,
                          "checkpoint '%s' holds %" PRIu64 " tensors / %" PRIu64
                          " parameters / %" PRIu64 " buffer values, but this model has %d / "
                          "%zu / %zu: the &model or &moe settings differ from the run that "
                          "saved it (its config.nml shows them)",
                          path, ntensors, nparams, nbuffers, v->ntensors, v->nparams,
                          v->nbuffers);
    for (int i = 0; i < v->ntensors; i++) {
        uint64_t len = get_u64(&s);
        const char *name = len < 4096 ? get_bytes(&s, len) : NULL;
        uint64_t ndim = get_u64(&s);
        long long shape[4];
        for (int d = 0; d < 4; d++) shape[d] = (long long)get_u64(&s);
        if (s.short_read || !name) return corrupt(err, path, "the tensor table is truncated");
        if (len != strlen(v->names[i]) || memcmp(name, v->names[i], len) ||
            ndim != (uint64_t)v->ndims[i] || memcmp(shape, v->shapes[i], sizeof shape))
            return mt_err_set(err, MT_EINVAL,
                              "checkpoint '%s': tensor %d is '%.*s' [%lld,%lld,%lld,%lld] but "
                              "this model expects '%s' [%lld,%lld,%lld,%lld]: the model "
                              "configuration differs from the run that saved it",
                              path, i, (int)(len > 200 ? 200 : len), name, shape[0], shape[1],
                              shape[2], shape[3], v->names[i], v->shapes[i][0],
                              v->shapes[i][1], v->shapes[i][2], v->shapes[i][3]);
    }
    size_t pbytes = v->nparams * sizeof(float);
    const void *params = get_bytes(&s, pbytes);
    const void *m = get_bytes(&s, pbytes);
    const void *vv = get_bytes(&s, pbytes);
    const void *buf = get_bytes(&s, v->nbuffers * sizeof(float));
    if (s.short_read || s.off != s.n)
        return corrupt(err, path, "its size does not match its header");
    memcpy(v->params, params, pbytes);
    memcpy(v->adam_m, m, pbytes);
    memcpy(v->adam_v, vv, pbytes);
    if (v->nbuffers) memcpy(v->buffers, buf, v->nbuffers * sizeof(float));
    *st = t;
    return MT_OK;
}

int mt_ckpt_load(const char *dir, struct mt_ckpt_view *v, struct mt_train_state *st,
                 bool *found, char *loaded, size_t loaded_len, struct mt_err *err)
{
    char path[4400], iter_dir[4200];
    struct stat sb;
    *found = false;
    snprintf(path, sizeof path, "%s/state.bin", dir);
    if (stat(path, &sb) == 0) {
        snprintf(iter_dir, sizeof iter_dir, "%s", dir); /* dir is an iter_* directory */
    } else {
        snprintf(path, sizeof path, "%s/%s", dir, LATEST_FILE);
        FILE *f = fopen(path, "r");
        if (!f) {
            if (errno == ENOENT) return MT_OK; /* nothing saved yet */
            return mt_err_errno(err, "checkpoint: cannot open '%s'", path);
        }
        long long it = -1;
        char extra;
        int got = fscanf(f, "%lld %c", &it, &extra);
        fclose(f);
        if (got != 1 || it < 0)
            return mt_err_set(err, MT_ECORRUPT,
                              "checkpoint: '%s' should hold one iteration number; fix or "
                              "remove it",
                              path);
        snprintf(iter_dir, sizeof iter_dir, "%s/iter_%07lld", dir, it);
        snprintf(path, sizeof path, "%s/state.bin", iter_dir);
    }
    unsigned char *data = NULL;
    size_t n = 0;
    MT_CHECK(read_file(path, &data, &n, err));
    int rc = parse_state(path, data, n, v, st, err);
    free(data);
    if (rc == MT_OK) {
        *found = true;
        if (loaded) snprintf(loaded, loaded_len, "%s", iter_dir);
    }
    return rc;
}

/* ---- reading a file whole (tools and tests) ------------------------------ */

/* Builds f's view from the file's own header and table, then parses as a load does. */
int mt_ckpt_read(const char *path, struct mt_ckpt_file *f, struct mt_err *err)
{
    memset(f, 0, sizeof *f);
    unsigned char *data = NULL;
    size_t n = 0;
    MT_CHECK(read_file(path, &data, &n, err));
    struct source s = { data, n, 8 + 6 * 8, false }; /* magic, version, 5 state words */
    uint64_t ntensors = get_u64(&s), nparams = get_u64(&s), nbuffers = get_u64(&s);
    int rc = MT_OK;
    if (n < 16 || memcmp(data, CKPT_MAGIC, 8) != 0 || s.short_read || ntensors > 1000000 ||
        nparams > n / sizeof(float) || nbuffers > n / sizeof(float)) {
        rc = corrupt(err, path, "its header is not a moetrain checkpoint's");
        goto out;
    }
    struct mt_ckpt_view *v = &f->view;
    v->ntensors = (int)ntensors;
    v->nparams = nparams;
    v->nbuffers = nbuffers;
    char **names = calloc(ntensors + 1, sizeof *names);
    int *ndims = calloc(ntensors + 1, sizeof *ndims);
    long long (*shapes)[4] = calloc(ntensors + 1, sizeof *shapes);
    v->names = (const char *const *)names;
    v->ndims = ndims;
    v->shapes = (const long long (*)[4])shapes;
    v->params = malloc(sizeof(float) * (nparams ? nparams : 1));
    v->adam_m = malloc(sizeof(float) * (nparams ? nparams : 1));
    v->adam_v = malloc(sizeof(float) * (nparams ? nparams : 1));
    v->buffers = malloc(sizeof(float) * (nbuffers ? nbuffers : 1));
    if (!names || !ndims || !shapes || !v->params || !v->adam_m || !v->adam_v || !v->buffers) {
        rc = mt_err_set(err, MT_ENOMEM, "checkpoint: no memory to read '%s'", path);
        goto out;
    }
    for (uint64_t i = 0; i < ntensors; i++) {
        uint64_t len = get_u64(&s);
        const char *name = len < 4096 ? get_bytes(&s, len) : NULL;
        uint64_t nd = get_u64(&s);
        for (int d = 0; d < 4; d++) shapes[i][d] = (long long)get_u64(&s);
        if (s.short_read || !name || nd > 4) {
            rc = corrupt(err, path, "the tensor table is truncated");
            goto out;
        }
        names[i] = strndup(name, len);
        if (!names[i]) {
            rc = mt_err_set(err, MT_ENOMEM, "checkpoint: no memory to read '%s'", path);
            goto out;
        }
        ndims[i] = (int)nd;
    }
    rc = parse_state(path, data, n, v, &f->state, err);
out:
    free(data);
    if (rc != MT_OK) mt_ckpt_file_free(f);
    return rc;
}

void mt_ckpt_file_free(struct mt_ckpt_file *f)
{
    struct mt_ckpt_view *v = &f->view;
    for (int i = 0; v->names && i < v->ntensors; i++) free((char *)v->names[i]);
    free((void *)v->names);
    free((void *)v->ndims);
    free((void *)v->shapes);
    free(v->params);
    free(v->adam_m);
    free(v->adam_v);
    free(v->buffers);
    memset(f, 0, sizeof *f);
}
