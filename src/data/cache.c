/* The index cache: arrays that take a while to build (document, sample,
 * shuffle and blend indices) stored under data%data_cache_path in a file named
 * by a hash of every input that shaped them. The file repeats that description
 * in full and ends in a checksum, so a stale, truncated or damaged file is
 * recognised and rebuilt, never used.
 *
 *   char   magic[8]   "MTDCACHE"
 *   uint32 version    1
 *   uint32 n          arrays
 *   uint64 desc_len,  char desc[desc_len]
 *   n x { uint32 elem_size, uint32 0, uint64 count }
 *   the n arrays' data, in order
 *   uint64 FNV-1a of every byte before it */
#include "data/data_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CACHE_MAGIC "MTDCACHE"
#define CACHE_VERSION 1u
#define MAX_ARRAYS 8

uint64_t mt_hash64(const void *p, size_t n, uint64_t h)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

void mt_cache_path(const char *dir, const char *desc, const char *tag, char *out, size_t n)
{
    uint64_t h = mt_hash64(desc, strlen(desc), MT_HASH64_INIT);
    snprintf(out, n, "%s/%016" PRIx64 "-%s.mtidx", dir, h, tag);
}

/* Reads exactly n bytes, hashing them; false on a short read. */
static bool read_hashed(FILE *f, void *p, size_t n, uint64_t *h)
{
    if (n && fread(p, 1, n, f) != n) return false;
    *h = mt_hash64(p, n, *h);
    return true;
}

static void free_arrays(struct mt_cache_array *a, int n)
{
    for (int i = 0; i < n; i++) {
        free(a[i].data);
        a[i].data = NULL;
        a[i].count = 0;
    }
}

/* Parses an open cache file into arrays; returns a reason string on rejection. */
static const char *parse(FILE *f, uint64_t size, const char *desc, struct mt_cache_array *arrays,
                         int n)
{
    uint64_t h = MT_HASH64_INIT;
    char magic[8];
    uint32_t version, narrays;
    uint64_t desc_len;
    if (!read_hashed(f, magic, 8, &h) || memcmp(magic, CACHE_MAGIC, 8) != 0) return "bad magic";
    if (!read_hashed(f, &version, 4, &h) || version != CACHE_VERSION) return "other version";
    if (!read_hashed(f, &narrays, 4, &h) || narrays != (uint32_t)n)
        return "wrong number of arrays";
    size_t want_len = strlen(desc);
    if (!read_hashed(f, &desc_len, 8, &h) || desc_len != want_len)
        return "built for other inputs";
    char *got = malloc(want_len + 1);
    if (!got) return "out of memory";
    bool same = read_hashed(f, got, want_len, &h) && memcmp(got, desc, want_len) == 0;
    free(got);
    if (!same) return "built for other inputs";
    uint64_t expect = 8 + 4 + 4 + 8 + want_len + 16 * (uint64_t)n + 8;
    for (int i = 0; i < n; i++) {
        uint32_t shape[2];
        uint64_t count;
        if (!read_hashed(f, shape, 8, &h) || !read_hashed(f, &count, 8, &h) ||
            shape[0] != arrays[i].elem_size || shape[1] != 0)
            return "array shapes differ";
        if (expect > size || count > (size - expect) / shape[0]) return "truncated";
        arrays[i].count = count;
        expect += count * shape[0];
    }
    if (expect != size) return expect > size ? "truncated" : "trailing bytes";
    for (int i = 0; i < n; i++) {
        size_t bytes = arrays[i].count * arrays[i].elem_size;
        arrays[i].data = malloc(bytes ? bytes : 1);
        if (!arrays[i].data) return "out of memory";
        if (!read_hashed(f, arrays[i].data, bytes, &h)) return "truncated";
    }
    uint64_t sum;
    if (fread(&sum, 8, 1, f) != 1) return "truncated";
    if (sum != h) return "checksum mismatch";
    return NULL;
}

int mt_cache_load(const char *path, const char *desc, struct mt_cache_array *arrays, int n,
                  enum mt_cache_status *status, char *reason, size_t reason_n,
                  struct mt_err *err)
{
    *status = MT_CACHE_MISS;
    if (reason_n) reason[0] = '\0';
    for (int i = 0; i < n; i++) {
        arrays[i].data = NULL;
        arrays[i].count = 0;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT || errno == ENOTDIR) return MT_OK;  /* store says why */
        return mt_err_errno(err, "%s", path);
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0) {
        int rc = mt_err_errno(err, "%s", path);
        fclose(f);
        return rc;
    }
    const char *why = n > MAX_ARRAYS ? "too many arrays" : parse(f, (uint64_t)st.st_size, desc,
                                                                 arrays, n);
    fclose(f);
    if (why) {
        free_arrays(arrays, n);
        *status = MT_CACHE_REJECTED;
        snprintf(reason, reason_n, "%s: %s", path, why);
        return MT_OK;
    }
    *status = MT_CACHE_HIT;
    return MT_OK;
}

static int dir_error(struct mt_err *err, const char *what, const char *path)
{
    int e = errno;
    return mt_err_set(err, MT_EIO,
                      "data%%data_cache_path: %s %s: %s\nhint: make data%%data_cache_path a"
                      " writable directory, or set it to '' to keep the indices in memory only",
                      what, path, strerror(e));
}

static int make_dirs(const char *dir, struct mt_err *err)
{
    char path[4096];
    if (snprintf(path, sizeof path, "%s", dir) >= (int)sizeof path)
        return mt_err_set(err, MT_EINVAL, "data%%data_cache_path is too long");
    for (char *p = path + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST)
            return dir_error(err, "mkdir", path);
        *p = '/';
    }
    if (mkdir(path, 0777) != 0 && errno != EEXIST)
        return dir_error(err, "mkdir", path);
    return MT_OK;
}

static bool write_hashed(FILE *f, const void *p, size_t n, uint64_t *h)
{
    *h = mt_hash64(p, n, *h);
    return n == 0 || fwrite(p, 1, n, f) == n;
}

int mt_cache_store(const char *dir, const char *path, const char *desc,
                   const struct mt_cache_array *arrays, int n, struct mt_err *err)
{
    MT_CHECK(make_dirs(dir, err));
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return dir_error(err, "cannot create", tmp);
    uint64_t h = MT_HASH64_INIT;
    uint32_t version = CACHE_VERSION, narrays = (uint32_t)n;
    uint64_t desc_len = strlen(desc);
    bool ok = write_hashed(f, CACHE_MAGIC, 8, &h) && write_hashed(f, &version, 4, &h) &&
              write_hashed(f, &narrays, 4, &h) && write_hashed(f, &desc_len, 8, &h) &&
              write_hashed(f, desc, desc_len, &h);
    for (int i = 0; ok && i < n; i++) {
        uint32_t shape[2] = {arrays[i].elem_size, 0};
        ok = write_hashed(f, shape, 8, &h) && write_hashed(f, &arrays[i].count, 8, &h);
    }
    for (int i = 0; ok && i < n; i++)
        ok = write_hashed(f, arrays[i].data, arrays[i].count * arrays[i].elem_size, &h);
    ok = ok && fwrite(&h, 8, 1, f) == 1 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        if (ok) saved = errno;
        unlink(tmp);
        errno = saved;
        return mt_err_errno(err, "writing index cache %s", path);
    }
    return MT_OK;
}
