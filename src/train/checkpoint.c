/* The save directory and the one-process format.
 *
 * DIR/iter_0000100/            one checkpoint: the sharded format (index.json and
 *                              rank_*.safetensors, ckpt_shard.h) or the one-process
 *                              state.bin (header, tensor table, params, Adam m and v,
 *                              buffers, then an FNV-1a 64 checksum of all before)
 * DIR/iter_0000100/config.nml  the resolved configuration (for people)
 * DIR/latest_checkpointed_iteration.txt
 *
 * DIR/.moetrain.lock           held (a POSIX lock) by the run saving here
 *
 * A save is written to DIR/iter_0000100.tmp, fsynced, and renamed into place;
 * only then does the "latest" file (itself replaced by rename) point to it, so a
 * crash at any moment leaves the previous checkpoint whole and referenced. A run
 * holds the directory's lock from start to end: a second run saving there is
 * refused at its start, and leftovers of crashed saves are removed only under the
 * lock. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "train/ckpt_shard.h"
#include "train/train.h"

#define LATEST_FILE "latest_checkpointed_iteration.txt"

/* ---- a writer that checksums what it writes ---------------------------- */

struct sink {
    FILE *f;
    uint64_t hash;
    bool failed;
};

uint64_t mt_ckpt_fnv1a(uint64_t h, const void *p, size_t n)
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
    s->hash = mt_ckpt_fnv1a(s->hash, p, n);
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
            return mt_err_errno(err, "checkpoint%%save '%s': cannot create directory '%s'",
                                path, buf);
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
        return mt_err_errno(err, "checkpoint%%save '%s': cannot create the directory", path);
    return MT_OK;
}

/* Whether name is a file a checkpoint directory holds: the one-process state, the
 * sharded format's index and shard files, the configuration. */
static bool ckpt_file_name(const char *name)
{
    int r, end = 0;
    if (!strcmp(name, "state.bin") || !strcmp(name, "config.nml") ||
        !strcmp(name, MT_SHARD_INDEX))
        return true;
    return sscanf(name, "rank_%d.safetensors%n", &r, &end) == 1 && r >= 0 &&
           name[end] == '\0' && !strncmp(name, "rank_", 5);
}

/* Removes a checkpoint directory (only the files a checkpoint holds: a directory with
 * anything else in it stays). Returns whether it is gone. */
static bool remove_ckpt_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return false;
    struct dirent *e;
    char path[4400];
    /* the marker files last: a removal cut short (a kill while pruning) leaves a
     * directory that still looks like a checkpoint, so the next prune takes it */
    for (int pass = 0; pass < 2; pass++) {
        rewinddir(d);
        while ((e = readdir(d))) {
            if (!ckpt_file_name(e->d_name)) continue;
            bool marker = !strcmp(e->d_name, MT_SHARD_INDEX) || !strcmp(e->d_name, "state.bin");
            if (marker != (pass == 1)) continue;
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    }
    closedir(d);
    return rmdir(dir) == 0;
}

/* The file that marks dir as a whole checkpoint (the last written): index.json of the
 * sharded format, else state.bin. Returns whether there is one (sb gets its stat). */
static bool ckpt_marker(const char *dir, struct stat *sb)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, MT_SHARD_INDEX);
    if (stat(path, sb) == 0) return true;
    snprintf(path, sizeof path, "%s/state.bin", dir);
    return stat(path, sb) == 0;
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

/* ---- the save directory, held for the whole run ------------------------- */

struct mt_ckpt_dir {
    char path[4096];
    int lock_fd;
};

/* The name of an iteration's directory: iter_%07lld and nothing after it. */
static bool iter_name(const char *name, long long *it)
{
    char tail;
    return sscanf(name, "iter_%lld%c", it, &tail) == 1 && *it >= 0 &&
           !strncmp(name, "iter_", 5) && name[5] >= '0' && name[5] <= '9';
}

/* Who holds the lock, as the holder wrote it into the lock file. */
static void lock_holder(int fd, char *buf, size_t len)
{
    ssize_t n = pread(fd, buf, len - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    char *nl = strchr(buf, '\n');
    if (nl) *nl = '\0';
    struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
    if (!buf[0] && fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK)
        snprintf(buf, len, "pid %d on this host", (int)fl.l_pid);
    if (!buf[0]) snprintf(buf, len, "an unknown process");
}

static int take_lock(struct mt_ckpt_dir *d, struct mt_err *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", d->path, MT_CKPT_LOCK_FILE);
    d->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (d->lock_fd < 0)
        return mt_err_errno(err, "checkpoint%%save '%s': cannot create the lock file '%s'",
                            d->path, path);
    /* a POSIX record lock: honoured across the nodes of NFS and Lustre (mounted with
     * -o flock), released by the kernel when the process ends however it ends */
    struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET };
    if (fcntl(d->lock_fd, F_SETLK, &fl) != 0) {
        int e = errno;
        char who[512];
        lock_holder(d->lock_fd, who, sizeof who);
        if (e == EACCES || e == EAGAIN)
            return mt_err_set(err, MT_EIO,
                              "checkpoint%%save '%s' is in use by another run (%s): two runs "
                              "saving into one directory would overwrite each other's "
                              "checkpoints. Wait for that run to end, or give this run another "
                              "checkpoint%%save directory",
                              d->path, who);
        errno = e;
        return mt_err_errno(err, "checkpoint%%save '%s': cannot lock '%s' (the file system "
                            "must support POSIX locks; on Lustre mount with -o flock)",
                            d->path, path);
    }
    char host[256] = "?", text[600];
    gethostname(host, sizeof host - 1);
    const char *job = getenv("SLURM_JOB_ID");
    snprintf(text, sizeof text, "pid %d on host %s%s%s, since %lld\n", (int)getpid(), host,
             job ? ", Slurm job " : "", job ? job : "", (long long)time(NULL));
    size_t n = strlen(text);
    if (ftruncate(d->lock_fd, 0) != 0 || pwrite(d->lock_fd, text, n, 0) != (ssize_t)n)
        return mt_err_errno(err, "checkpoint%%save '%s': cannot write the lock file '%s'",
                            d->path, path);
    return MT_OK;
}

/* Proves that a checkpoint can be written: a file is created, written, synced and
 * removed. */
static int write_test(const struct mt_ckpt_dir *d, struct mt_err *err)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/.moetrain-write-test", d->path);
    int rc = write_text_file(path, "moetrain checks that it can save here\n", err);
    unlink(path);
    if (rc) return mt_err_prefix(err, "checkpoint%%save '%s' is not writable", d->path);
    return MT_OK;
}

/* What crashed saves left (under the lock, so no other run's save is in progress):
 * iter_N.tmp directories are removed; an iter_N.old whose iter_N is missing (a crash
 * between the two renames of a re-save) is renamed back, otherwise removed; a
 * half-written latest file is removed; an iter_N without its marker file (a prune cut
 * short) is removed. */
static int clean_leftovers(const struct mt_ckpt_dir *d, int *removed, int *restored)
{
    *removed = *restored = 0;
    DIR *dir = opendir(d->path);
    if (!dir) return MT_OK;
    struct dirent *e;
    while ((e = readdir(dir))) {
        char base[300], path[4400], orig[4400];
        long long it;
        struct stat sb;
        size_t len = strlen(e->d_name);
        if (iter_name(e->d_name, &it)) { /* a removal cut short after its marker went */
            snprintf(path, sizeof path, "%s/%s", d->path, e->d_name);
            if (!ckpt_marker(path, &sb) && remove_ckpt_dir(path)) ++*removed;
            continue;
        }
        if (len < 5 || len >= sizeof base) continue;
        const char *suffix = e->d_name + len - 4;
        if (strcmp(suffix, ".tmp") && strcmp(suffix, ".old")) continue;
        memcpy(base, e->d_name, len - 4);
        base[len - 4] = '\0';
        snprintf(path, sizeof path, "%s/%s", d->path, e->d_name);
        if (!strcmp(base, LATEST_FILE) && !strcmp(suffix, ".tmp")) {
            if (unlink(path) == 0) ++*removed;
            continue;
        }
        if (!iter_name(base, &it)) continue;
        snprintf(orig, sizeof orig, "%s/%s", d->path, base);
        if (!strcmp(suffix, ".old") && stat(orig, &sb) != 0 && rename(path, orig) == 0) {
            ++*restored;
            continue;
        }
        if (remove_ckpt_dir(path)) ++*removed;
    }
    closedir(dir);
    return MT_OK;
}

int mt_ckpt_dir_open(const char *path, struct mt_ckpt_dir **out, int *removed, int *restored,
                     struct mt_err *err)
{
    *out = NULL;
    if (strlen(path) >= sizeof((struct mt_ckpt_dir *)0)->path - 64)
        return mt_err_set(err, MT_EINVAL, "checkpoint%%save '%.100s...' is too long a path",
                          path);
    struct mt_ckpt_dir *d = calloc(1, sizeof *d);
    if (!d) return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    snprintf(d->path, sizeof d->path, "%s", path);
    d->lock_fd = -1;
    int rc = mkdir_p(path, err);
    if (rc == MT_OK) rc = take_lock(d, err);
    if (rc == MT_OK) rc = write_test(d, err);
    if (rc == MT_OK) rc = clean_leftovers(d, removed, restored);
    if (rc) {
        mt_ckpt_dir_close(d);
        return rc;
    }
    *out = d;
    return MT_OK;
}

const char *mt_ckpt_dir_path(const struct mt_ckpt_dir *d) { return d->path; }

void mt_ckpt_dir_close(struct mt_ckpt_dir *d)
{
    if (!d) return;
    if (d->lock_fd >= 0) close(d->lock_fd); /* releases the lock */
    free(d);
}

/* ---- saving ------------------------------------------------------------ */

static int write_state(const char *path, const struct mt_ckpt_view *v,
                       const struct mt_train_state *st, struct mt_err *err)
{
    FILE *f = fopen(path, "wb");
    if (!f) return mt_err_errno(err, "checkpoint: cannot create '%s'", path);
    struct sink s = { f, 0xcbf29ce484222325ull, false };
    put(&s, MT_CKPT1_MAGIC, 8);
    put_u64(&s, MT_CKPT1_VERSION);
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

/* An iteration directory and when its index (or state) was written. */
struct saved {
    long long it;
    struct timespec when;
};

/* Newest first: by the time the marker file was written, then by iteration. */
static int cmp_newest(const void *a, const void *b)
{
    const struct saved *x = a, *y = b;
    if (x->when.tv_sec != y->when.tv_sec) return x->when.tv_sec < y->when.tv_sec ? 1 : -1;
    if (x->when.tv_nsec != y->when.tv_nsec) return x->when.tv_nsec < y->when.tv_nsec ? 1 : -1;
    return (x->it < y->it) - (x->it > y->it);
}

/* Keeps the keep most recently written checkpoints of the directory (whatever their
 * iteration numbers: after a rollback the newest save may have the smallest), and
 * never the one just written, which latest names. Directories without an index.json
 * or state.bin are not checkpoints and are left alone. */
static void prune(const char *dir, int keep, long long just_written)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct saved *all = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long it;
        char path[4400];
        struct stat sb;
        if (!iter_name(e->d_name, &it)) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (!ckpt_marker(path, &sb)) continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 64;
            struct saved *g = realloc(all, nc * sizeof *g);
            if (!g) break; /* no memory: prune what was listed */
            all = g;
            cap = nc;
        }
        all[n++] = (struct saved){it, sb.st_mtim};
    }
    closedir(d);
    if (n) qsort(all, n, sizeof *all, cmp_newest);
    int kept = 0;
    for (size_t i = 0; i < n; i++) {
        if (all[i].it == just_written || kept < keep) {
            kept++;
            continue;
        }
        char path[4400];
        snprintf(path, sizeof path, "%s/iter_%07lld", dir, all[i].it);
        remove_ckpt_dir(path);
    }
    free(all);
}

/* Puts the whole new directory tmp in final's place, replacing an older save of the
 * same iteration so that some whole iter_N exists at every moment: an atomic
 * exchange where the file system has one; otherwise the old one is moved to
 * iter_N.old first, which a load and the next start fall back to (see
 * clean_leftovers and locate). */
static int publish(const char *tmp, const char *final, const char *old, struct mt_err *err)
{
    struct stat sb;
    if (stat(final, &sb) != 0) {
        if (rename(tmp, final) != 0)
            return mt_err_errno(err, "checkpoint: cannot rename '%s' to '%s'", tmp, final);
        return MT_OK;
    }
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        remove_ckpt_dir(tmp); /* now the older save */
        return MT_OK;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
        return mt_err_errno(err, "checkpoint: cannot exchange '%s' and '%s'", tmp, final);
    if (rename(final, old) != 0)
        return mt_err_errno(err, "checkpoint: cannot move aside '%s'", final);
    if (rename(tmp, final) != 0)
        return mt_err_errno(err, "checkpoint: cannot rename '%s' to '%s'", tmp, final);
    remove_ckpt_dir(old);
    return MT_OK;
}

static void iter_paths(const struct mt_ckpt_dir *d, long long it, char *final_dir,
                       char *tmp_dir, char *old_dir)
{
    snprintf(final_dir, 4200, "%s/iter_%07lld", d->path, it);
    snprintf(tmp_dir, 4300, "%s.tmp", final_dir);
    snprintf(old_dir, 4300, "%s.old", final_dir);
}

int mt_ckpt_begin(const struct mt_ckpt_dir *d, long long it, char *tmp, size_t len,
                  struct mt_err *err)
{
    char final_dir[4200], tmp_dir[4300], old_dir[4300];
    iter_paths(d, it, final_dir, tmp_dir, old_dir);
    remove_ckpt_dir(tmp_dir); /* ours: the lock keeps other runs out */
    if (mkdir(tmp_dir, 0755) != 0)
        return mt_err_errno(err, "checkpoint: cannot create '%s'", tmp_dir);
    snprintf(tmp, len, "%s", tmp_dir);
    return MT_OK;
}

void mt_ckpt_abort(const struct mt_ckpt_dir *d, long long it)
{
    char final_dir[4200], tmp_dir[4300], old_dir[4300];
    iter_paths(d, it, final_dir, tmp_dir, old_dir);
    remove_ckpt_dir(tmp_dir);
}

int mt_ckpt_publish(const struct mt_ckpt_dir *d, long long it, const char *config_text,
                    int keep_last, struct mt_err *err)
{
    const char *dir = d->path;
    char final_dir[4200], tmp_dir[4300], old_dir[4300], path[4400];
    iter_paths(d, it, final_dir, tmp_dir, old_dir);
    int rc;
    snprintf(path, sizeof path, "%s/config.nml", tmp_dir);
    MT_CHECK_GOTO(write_text_file(path, config_text, err), fail);
    MT_CHECK_GOTO(fsync_path(tmp_dir, err), fail);
    MT_CHECK_GOTO(publish(tmp_dir, final_dir, old_dir, err), fail);
    MT_CHECK(fsync_path(dir, err));

    char latest[4200], latest_tmp[4300], text[64];
    snprintf(latest, sizeof latest, "%s/%s", dir, LATEST_FILE);
    snprintf(latest_tmp, sizeof latest_tmp, "%s.tmp", latest);
    snprintf(text, sizeof text, "%lld\n", it);
    MT_CHECK(write_text_file(latest_tmp, text, err));
    if (rename(latest_tmp, latest) != 0)
        return mt_err_errno(err, "checkpoint: cannot rename '%s'", latest_tmp);
    MT_CHECK(fsync_path(dir, err));
    if (keep_last > 0) prune(dir, keep_last, it);
    return MT_OK;
fail:
    remove_ckpt_dir(tmp_dir);
    return rc;
}

int mt_ckpt_save(const struct mt_ckpt_dir *d, const struct mt_ckpt_view *v,
                 const struct mt_train_state *st, const char *config_text, int keep_last,
                 struct mt_err *err)
{
    char tmp_dir[4300], path[4400];
    MT_CHECK(mt_ckpt_begin(d, st->iteration, tmp_dir, sizeof tmp_dir, err));
    snprintf(path, sizeof path, "%s/state.bin", tmp_dir);
    int rc = write_state(path, v, st, err);
    if (rc) {
        remove_ckpt_dir(tmp_dir);
        return rc;
    }
    return mt_ckpt_publish(d, st->iteration, config_text, keep_last, err);
}

/* ---- loading ----------------------------------------------------------- */

/* Some entries of dir (iter_* directories first) into out, as "a, b, c (and N more)";
 * returns how many iter_* directories it holds. */
static int list_dir(const char *dir, char *out, size_t len)
{
    snprintf(out, len, "nothing");
    DIR *d = opendir(dir);
    if (!d) return 0;
    struct dirent *e;
    int shown = 0, more = 0, iters = 0;
    size_t at = 0;
    for (int pass = 0; pass < 2; pass++) {
        rewinddir(d);
        while ((e = readdir(d))) {
            long long it;
            if (e->d_name[0] == '.') continue;
            if ((pass == 0) != iter_name(e->d_name, &it)) continue;
            iters += pass == 0;
            if (shown == 8 || at + strlen(e->d_name) + 4 >= len) {
                more++;
                continue;
            }
            at += (size_t)snprintf(out + at, len - at, "%s%s", shown ? ", " : "", e->d_name);
            shown++;
        }
    }
    closedir(d);
    if (more && at + 32 < len) snprintf(out + at, len - at, " (and %d more)", more);
    return iters;
}

int mt_ckpt_locate(const char *dir, bool optional, char *iter_dir, size_t len, bool *found,
                   struct mt_err *err)
{
    char path[4400];
    struct stat sb;
    *found = false;
    if (ckpt_marker(dir, &sb)) { /* dir is an iter_* directory */
        snprintf(iter_dir, len, "%s", dir);
        *found = true;
        return MT_OK;
    }
    if (stat(dir, &sb) != 0) {
        if (errno == ENOENT && optional) return MT_OK; /* a first run: nothing saved yet */
        if (errno == ENOENT)
            return mt_err_set(err, MT_EINVAL,
                              "checkpoint%%load '%s' does not exist. Check the path; to start "
                              "from initialisation when it holds no checkpoint yet (a job "
                              "that saves and resumes there), set checkpoint%%load_optional "
                              "= .true.",
                              dir);
        return mt_err_errno(err, "checkpoint%%load '%s'", dir);
    }
    if (!S_ISDIR(sb.st_mode))
        return mt_err_set(err, MT_EINVAL,
                          "checkpoint%%load '%s' is not a directory: give a checkpoint "
                          "directory or one of its iter_* directories",
                          dir);
    snprintf(path, sizeof path, "%s/%s", dir, LATEST_FILE);
    FILE *f = fopen(path, "r");
    if (f) {
        long long it = -1;
        char extra;
        int got = fscanf(f, "%lld %c", &it, &extra);
        fclose(f);
        if (got != 1 || it < 0)
            return mt_err_set(err, MT_ECORRUPT,
                              "checkpoint: '%s' should hold one iteration number; fix or "
                              "remove it",
                              path);
        snprintf(iter_dir, len, "%s/iter_%07lld", dir, it);
        if (stat(iter_dir, &sb) != 0) {
            /* a crash between the two renames of a re-save (see publish) */
            char old[4400];
            snprintf(old, sizeof old, "%s.old", iter_dir);
            if (stat(old, &sb) != 0) {
                char what[2048];
                list_dir(dir, what, sizeof what);
                return mt_err_set(err, MT_ECORRUPT,
                                  "checkpoint: '%s' names iteration %lld, but '%s' is missing. "
                                  "Set checkpoint%%load to one of the directories there: %s",
                                  path, it, iter_dir, what);
            }
            snprintf(iter_dir, len, "%s", old);
        }
        *found = true;
        return MT_OK;
    }
    if (errno != ENOENT) return mt_err_errno(err, "checkpoint: cannot open '%s'", path);
    char what[2048];
    if (list_dir(dir, what, sizeof what) > 0)
        return mt_err_set(err, MT_EINVAL,
                          "checkpoint%%load '%s' has no %s but holds %s: set checkpoint%%load "
                          "to the iter_* directory to resume from (or write its iteration "
                          "number into %s)",
                          dir, LATEST_FILE, what, path);
    if (optional) return MT_OK;
    return mt_err_set(err, MT_EINVAL,
                      "checkpoint%%load '%s' holds no checkpoint (no %s; it holds %s). Check "
                      "the path; to start from initialisation when it holds no checkpoint yet, "
                      "set checkpoint%%load_optional = .true.",
                      dir, LATEST_FILE, what);
}

/* ---- reading a checkpoint whole (tools and tests) ------------------------------ */

int mt_ckpt_read(const char *path, struct mt_ckpt_file *f, struct mt_err *err)
{
    memset(f, 0, sizeof *f);
    char dir[4200];
    struct stat sb;
    if (stat(path, &sb) != 0) return mt_err_errno(err, "checkpoint: '%s'", path);
    snprintf(dir, sizeof dir, "%s", path);
    if (!S_ISDIR(sb.st_mode)) { /* a state.bin: its directory */
        char *slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        else snprintf(dir, sizeof dir, ".");
    }
    char *text = NULL;
    size_t len = 0;
    MT_CHECK(mt_shard_index_text(dir, &text, &len, err));
    struct mt_shard_index *ix = NULL;
    int rc = mt_shard_index_open(dir, text, len, &ix, err);
    free(text);
    if (rc) return rc;
    struct mt_ckpt_view table, *v = &f->view;
    mt_shard_index_table(ix, &table);
    const int n = table.ntensors;
    char **names = calloc((size_t)n + 1, sizeof *names);
    int *ndims = calloc((size_t)n + 1, sizeof *ndims);
    long long (*shapes)[4] = calloc((size_t)n + 1, sizeof *shapes);
    struct mt_shard_piece *p = calloc(3 * (size_t)n + 1, sizeof *p);
    v->names = (const char *const *)names;
    v->ndims = ndims;
    v->shapes = (const long long (*)[4])shapes;
    v->ntensors = n;
    v->nparams = table.nparams;
    v->nbuffers = table.nbuffers;
    v->params = malloc(sizeof(float) * (table.nparams ? table.nparams : 1));
    v->adam_m = malloc(sizeof(float) * (table.nparams ? table.nparams : 1));
    v->adam_v = malloc(sizeof(float) * (table.nparams ? table.nparams : 1));
    v->buffers = malloc(sizeof(float) * (table.nbuffers ? table.nbuffers : 1));
    if (!names || !ndims || !shapes || !p || !v->params || !v->adam_m || !v->adam_v ||
        !v->buffers) {
        rc = mt_err_set(err, MT_ENOMEM, "checkpoint: no memory to read '%s' whole", dir);
        goto out;
    }
    static const char *const prefixes[3] = {"", MT_SHARD_PREFIX_M, MT_SHARD_PREFIX_V};
    float *arrays[3] = {v->params, v->adam_m, v->adam_v};
    size_t at = 0;
    int np = 0;
    for (int i = 0; i < n; i++) {
        if (!(names[i] = strdup(table.names[i]))) {
            rc = mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
            goto out;
        }
        ndims[i] = table.ndims[i];
        memcpy(shapes[i], table.shapes[i], sizeof shapes[i]);
        for (int k = 0; k < 3; k++)
            mt_shard_whole_piece(&p[np++], prefixes[k], names[i], ndims[i], shapes[i],
                                 arrays[k] + at);
        at += p[np - 1].hi;
    }
    const long long nb = (long long)table.nbuffers;
    if (nb) mt_shard_whole_piece(&p[np++], "", MT_SHARD_BIAS, 1, &nb, v->buffers);
    rc = mt_shard_read(ix, p, np, err);
    f->state = *mt_shard_index_state(ix);
out:
    free(p);
    mt_shard_index_free(ix);
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
