/* Megatron indexed datasets (MMapIndexedDataset): reading and writing.
 *
 * <prefix>.idx, little-endian, no padding:
 *   char     magic[9]        "MMIDIDX\0\0"
 *   uint64   version         1
 *   uint8    dtype           Megatron DType code of the tokens in .bin
 *   uint64   sequence_count  S
 *   uint64   document_count  D + 1 (entries of document_indices)
 *   int32    sequence_lengths[S]    tokens per sequence
 *   int64    sequence_pointers[S]   byte offset of each sequence in .bin
 *   int64    document_indices[D+1]  0, then the sequence index ending each document
 * <prefix>.bin is the tokens of every sequence, back to back.
 *
 * The arrays start at byte 34, so they are unaligned: every element is read with
 * memcpy.
 *
 * Nothing is memory-mapped: the .idx is read into memory at open (12 bytes per
 * sequence, 8 per document) and the tokens are read from the .bin with pread, so
 * a file truncated or rewritten in place during a run is an error naming it, not a
 * SIGBUS. Datasets must be replaced atomically (new files renamed over the old). */
#include "data/data.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "indexed datasets are little-endian; this reader assumes a little-endian host"
#endif

#define IDX_MAGIC "MMIDIDX\0\0"
#define IDX_MAGIC_LEN 9
#define IDX_HEADER_LEN 34  /* magic 9 + version 8 + dtype 1 + counts 16 */
#define FIX_HINT "hint: re-run moetrain-preprocess to regenerate %s.bin and %s.idx"

size_t mt_token_dtype_size(int code)
{
    switch (code) {
    case MT_DTYPE_UINT8: case MT_DTYPE_INT8: return 1;
    case MT_DTYPE_INT16: case MT_DTYPE_UINT16: return 2;
    case MT_DTYPE_INT32: case MT_DTYPE_FLOAT32: return 4;
    case MT_DTYPE_INT64: case MT_DTYPE_FLOAT64: return 8;
    default: return 0;
    }
}

const char *mt_token_dtype_name(int code)
{
    switch (code) {
    case MT_DTYPE_UINT8: return "uint8";
    case MT_DTYPE_INT8: return "int8";
    case MT_DTYPE_INT16: return "int16";
    case MT_DTYPE_INT32: return "int32";
    case MT_DTYPE_INT64: return "int64";
    case MT_DTYPE_FLOAT64: return "float64";
    case MT_DTYPE_FLOAT32: return "float32";
    case MT_DTYPE_UINT16: return "uint16";
    default: return "?";
    }
}

/* ------------------------------------------------------------------------- */
/* Reader                                                                     */
/* ------------------------------------------------------------------------- */

#define REPLACE_HINT                                                                    \
    "hint: datasets must be replaced atomically: write the new .bin and .idx under other " \
    "names and rename them over the old ones (moetrain-preprocess does), never rewrite "   \
    "them in place while a run reads them"

struct mt_indexed {
    char *prefix;
    char *idx_path, *bin_path;
    struct { unsigned char *p; uint64_t size; } idx;  /* the whole .idx, in memory */
    struct { int fd; uint64_t size; } bin;            /* the .bin, read with pread */
    int dtype;
    size_t elem;
    uint64_t nseq, ndocidx;   /* ndocidx = documents + 1 */
    uint64_t ntokens;
    const unsigned char *lengths, *pointers, *docs;  /* into idx */
};

static int32_t load_i32(const unsigned char *p, uint64_t i)
{
    int32_t v;
    memcpy(&v, p + 4 * i, 4);
    return v;
}

static int64_t load_i64(const unsigned char *p, uint64_t i)
{
    int64_t v;
    memcpy(&v, p + 8 * i, 8);
    return v;
}

static uint64_t load_u64(const unsigned char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static char *concat(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    char *s = malloc(na + nb + 1);
    if (!s) return NULL;
    memcpy(s, a, na);
    memcpy(s + na, b, nb + 1);
    return s;
}

/* Reads bytes [pos, pos+n) of fd into buf; a file that ends before is MT_ECORRUPT. */
static int read_at(int fd, const char *path, uint64_t pos, void *buf, size_t n,
                   struct mt_err *err)
{
    for (size_t got = 0; got < n;) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(pos + got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return mt_err_errno(err, "%s: read of bytes %" PRIu64 "..%" PRIu64, path,
                                       pos, pos + n);
        if (r == 0)
            return mt_err_set(err, MT_ECORRUPT,
                              "%s: the file ends at byte %" PRIu64 ", before bytes %" PRIu64
                              "..%" PRIu64 " it had when opened: it was truncated or rewritten"
                              " while being read\n" REPLACE_HINT,
                              path, pos + got, pos, pos + n);
        got += (size_t)r;
    }
    return MT_OK;
}

static int open_sized(const char *path, int *fd, uint64_t *size, struct mt_err *err)
{
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd < 0) return mt_err_errno(err, "%s", path);
    struct stat st;
    if (fstat(*fd, &st) != 0) {
        int rc = mt_err_errno(err, "%s", path);
        close(*fd);
        *fd = -1;
        return rc;
    }
    *size = (uint64_t)st.st_size;
    return MT_OK;
}

static int load_idx(struct mt_indexed *ix, struct mt_err *err)
{
    int fd;
    MT_CHECK(open_sized(ix->idx_path, &fd, &ix->idx.size, err));
    int rc = MT_OK;
    if (!(ix->idx.p = malloc(ix->idx.size ? (size_t)ix->idx.size : 1)))
        rc = mt_err_set(err, MT_ENOMEM, "%s: out of memory reading the index (%" PRIu64
                        " bytes)", ix->idx_path, ix->idx.size);
    else
        rc = read_at(fd, ix->idx_path, 0, ix->idx.p, (size_t)ix->idx.size, err);
    close(fd);
    return rc;
}

void mt_indexed_close(struct mt_indexed *ix)
{
    if (!ix) return;
    free(ix->idx.p);
    if (ix->bin.fd >= 0) close(ix->bin.fd);
    free(ix->prefix);
    free(ix->idx_path);
    free(ix->bin_path);
    free(ix);
}

static int corrupt(const struct mt_indexed *ix, struct mt_err *err, const char *path,
                   const char *what)
{
    return mt_err_set(err, MT_ECORRUPT, "%s: corrupt indexed dataset: %s\n" FIX_HINT, path, what,
                      ix->prefix, ix->prefix);
}

static int check_header(struct mt_indexed *ix, struct mt_err *err)
{
    char what[512];
    const unsigned char *p = ix->idx.p;
    if (ix->idx.size < IDX_HEADER_LEN) {
        snprintf(what, sizeof what, "truncated header (%" PRIu64 " bytes, need %d)",
                 ix->idx.size, IDX_HEADER_LEN);
        return corrupt(ix, err, ix->idx_path, what);
    }
    if (memcmp(p, IDX_MAGIC, IDX_MAGIC_LEN) != 0)
        return corrupt(ix, err, ix->idx_path,
                       "bad magic (not a Megatron MMIDIDX index; is this the .bin or an old"
                       " lazy/cached-format index?)");
    uint64_t version = load_u64(p + 9);
    if (version != 1) {
        snprintf(what, sizeof what, "unsupported version %" PRIu64 " (only version 1 exists)",
                 version);
        return corrupt(ix, err, ix->idx_path, what);
    }
    ix->dtype = p[17];
    ix->elem = mt_token_dtype_size(ix->dtype);
    if (ix->elem == 0) {
        snprintf(what, sizeof what, "unknown dtype code %d (Megatron codes are 1..8)", ix->dtype);
        return corrupt(ix, err, ix->idx_path, what);
    }
    ix->nseq = load_u64(p + 18);
    ix->ndocidx = load_u64(p + 26);
    /* Every array must fit the file; compare counts before multiplying. */
    uint64_t room = ix->idx.size - IDX_HEADER_LEN;
    bool fits = ix->nseq <= room / 12 && ix->ndocidx <= (room - 12 * ix->nseq) / 8;
    if (!fits || IDX_HEADER_LEN + 12 * ix->nseq + 8 * ix->ndocidx != ix->idx.size) {
        snprintf(what, sizeof what,
                 "file is %" PRIu64 " bytes but its header (%" PRIu64 " sequences, %" PRIu64
                 " document indices) needs %s%" PRIu64 " (%s)",
                 ix->idx.size, ix->nseq, ix->ndocidx, fits ? "" : "more than ",
                 fits ? IDX_HEADER_LEN + 12 * ix->nseq + 8 * ix->ndocidx : ix->idx.size,
                 fits ? "lengths mismatch" : "truncated file");
        return corrupt(ix, err, ix->idx_path, what);
    }
    ix->lengths = p + IDX_HEADER_LEN;
    ix->pointers = ix->lengths + 4 * ix->nseq;
    ix->docs = ix->pointers + 8 * ix->nseq;
    return MT_OK;
}

static int check_documents(struct mt_indexed *ix, struct mt_err *err)
{
    char what[512];
    if (ix->ndocidx == 0)
        return corrupt(ix, err, ix->idx_path, "no document indices (need at least the leading 0)");
    if (load_i64(ix->docs, 0) != 0)
        return corrupt(ix, err, ix->idx_path, "document indices do not start with 0");
    for (uint64_t d = 1; d < ix->ndocidx; d++) {
        int64_t a = load_i64(ix->docs, d - 1), b = load_i64(ix->docs, d);
        if (b < a) {
            snprintf(what, sizeof what,
                     "document indices decrease at document %" PRIu64 " (%" PRId64 " < %" PRId64
                     ")",
                     d - 1, b, a);
            return corrupt(ix, err, ix->idx_path, what);
        }
    }
    int64_t last = load_i64(ix->docs, ix->ndocidx - 1);
    if ((uint64_t)last != ix->nseq) {
        snprintf(what, sizeof what,
                 "last document index is %" PRId64 " but there are %" PRIu64 " sequences", last,
                 ix->nseq);
        return corrupt(ix, err, ix->idx_path, what);
    }
    return MT_OK;
}

static int check_sequences(struct mt_indexed *ix, struct mt_err *err)
{
    char what[512];
    uint64_t end = 0;  /* first byte after the previous sequence */
    ix->ntokens = 0;
    for (uint64_t s = 0; s < ix->nseq; s++) {
        int32_t len = load_i32(ix->lengths, s);
        int64_t ptr = load_i64(ix->pointers, s);
        if (len < 0) {
            snprintf(what, sizeof what, "sequence %" PRIu64 " has negative length %" PRId32, s,
                     len);
            return corrupt(ix, err, ix->idx_path, what);
        }
        if (ptr < 0) {
            snprintf(what, sizeof what, "sequence %" PRIu64 " has a negative pointer %" PRId64,
                     s, ptr);
            return corrupt(ix, err, ix->idx_path, what);
        }
        if ((uint64_t)ptr < end) {
            snprintf(what, sizeof what,
                     "sequence %" PRIu64 " starts at byte %" PRId64 ", inside the previous"
                     " sequence (which ends at byte %" PRIu64 "): pointers must increase",
                     s, ptr, end);
            return corrupt(ix, err, ix->idx_path, what);
        }
        uint64_t bytes = (uint64_t)len * ix->elem;
        if ((uint64_t)ptr > ix->bin.size || bytes > ix->bin.size - (uint64_t)ptr) {
            snprintf(what, sizeof what,
                     "sequence %" PRIu64 " (bytes %" PRId64 "..%" PRIu64 ") lies beyond the end of"
                     " %s (%" PRIu64 " bytes): pointer out of range or truncated .bin",
                     s, ptr, (uint64_t)ptr + bytes, ix->bin_path, ix->bin.size);
            return corrupt(ix, err, ix->idx_path, what);
        }
        end = (uint64_t)ptr + bytes;
        ix->ntokens += (uint64_t)len;
    }
    if (end != ix->bin.size) {
        snprintf(what, sizeof what,
                 "the index describes %" PRIu64 " bytes of tokens but the file has %" PRIu64
                 " (.bin and .idx do not belong together)",
                 end, ix->bin.size);
        return corrupt(ix, err, ix->bin_path, what);
    }
    return MT_OK;
}

int mt_indexed_open(const char *prefix, struct mt_indexed **out, struct mt_err *err)
{
    *out = NULL;
    struct mt_indexed *ix = calloc(1, sizeof *ix);
    if (!ix) return mt_err_set(err, MT_ENOMEM, "out of memory opening %s", prefix);
    ix->bin.fd = -1;
    ix->prefix = strdup(prefix);
    ix->idx_path = concat(prefix, ".idx");
    ix->bin_path = concat(prefix, ".bin");
    int rc;
    if (!ix->prefix || !ix->idx_path || !ix->bin_path) {
        rc = mt_err_set(err, MT_ENOMEM, "out of memory opening %s", prefix);
        goto fail;
    }
    MT_CHECK_GOTO(load_idx(ix, err), fail);
    MT_CHECK_GOTO(open_sized(ix->bin_path, &ix->bin.fd, &ix->bin.size, err), fail);
    MT_CHECK_GOTO(check_header(ix, err), fail);
    MT_CHECK_GOTO(check_documents(ix, err), fail);
    MT_CHECK_GOTO(check_sequences(ix, err), fail);
    *out = ix;
    return MT_OK;
fail:
    mt_indexed_close(ix);
    return rc;
}

const char *mt_indexed_prefix(const struct mt_indexed *ix) { return ix->prefix; }
int mt_indexed_dtype(const struct mt_indexed *ix) { return ix->dtype; }
uint64_t mt_indexed_num_sequences(const struct mt_indexed *ix) { return ix->nseq; }
uint64_t mt_indexed_num_documents(const struct mt_indexed *ix) { return ix->ndocidx - 1; }
uint64_t mt_indexed_num_tokens(const struct mt_indexed *ix) { return ix->ntokens; }

int32_t mt_indexed_sequence_length(const struct mt_indexed *ix, uint64_t seq)
{
    return load_i32(ix->lengths, seq);
}

uint64_t mt_indexed_document_of(const struct mt_indexed *ix, uint64_t seq)
{
    /* The last d with docs[d] <= seq. */
    uint64_t lo = 0, hi = ix->ndocidx - 1;
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        if ((uint64_t)load_i64(ix->docs, mid) <= seq)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Token i of the run at p; *integral is false for a float that is no int32. */
static int64_t token_at(int dtype, const unsigned char *p, uint64_t i, bool *integral)
{
    *integral = true;
    switch (dtype) {
    case MT_DTYPE_UINT8: return p[i];
    case MT_DTYPE_INT8: return (int8_t)p[i];
    case MT_DTYPE_INT16: { int16_t v; memcpy(&v, p + 2 * i, 2); return v; }
    case MT_DTYPE_UINT16: { uint16_t v; memcpy(&v, p + 2 * i, 2); return v; }
    case MT_DTYPE_INT32: { int32_t v; memcpy(&v, p + 4 * i, 4); return v; }
    case MT_DTYPE_INT64: { int64_t v; memcpy(&v, p + 8 * i, 8); return v; }
    default: break;
    }
    double v;
    if (dtype == MT_DTYPE_FLOAT32) {
        float f;
        memcpy(&f, p + 4 * i, 4);
        v = f;
    } else {
        memcpy(&v, p + 8 * i, 8);
    }
    if (!(v > -2147483648.0 && v < 2147483648.0) || v != floor(v)) {
        *integral = false;
        return -1;
    }
    return (int64_t)v;
}

/* The .bin still has the size it had at open (else it is being rewritten in place). */
static int check_bin_size(const struct mt_indexed *ix, struct mt_err *err)
{
    struct stat st;
    if (fstat(ix->bin.fd, &st) != 0) return mt_err_errno(err, "%s", ix->bin_path);
    if ((uint64_t)st.st_size == ix->bin.size) return MT_OK;
    return mt_err_set(err, MT_ECORRUPT,
                      "%s: the file is now %lld bytes, not the %" PRIu64 " it had when the run"
                      " opened it: it was truncated or rewritten while this run reads it\n"
                      REPLACE_HINT,
                      ix->bin_path, (long long)st.st_size, ix->bin.size);
}

int mt_indexed_read(const struct mt_indexed *ix, uint64_t seq, uint64_t off, uint64_t count,
                    int32_t vocab, int32_t *out, struct mt_err *err)
{
    if (seq >= ix->nseq || off > (uint64_t)load_i32(ix->lengths, seq) ||
        count > (uint64_t)load_i32(ix->lengths, seq) - off)
        return mt_err_set(err, MT_EINVAL,
                          "%s: read of tokens %" PRIu64 "..%" PRIu64 " of sequence %" PRIu64
                          " is out of range",
                          ix->bin_path, off, off + count, seq);
    if (count == 0) return MT_OK;
    MT_CHECK(check_bin_size(ix, err));
    const uint64_t start = (uint64_t)load_i64(ix->pointers, seq) + off * ix->elem;
    unsigned char buf[4096];
    const uint64_t chunk = sizeof buf / ix->elem;
    for (uint64_t done = 0; done < count; done += chunk) {
        const uint64_t n = count - done < chunk ? count - done : chunk;
        MT_CHECK(read_at(ix->bin.fd, ix->bin_path, start + done * ix->elem, buf,
                         (size_t)(n * ix->elem), err));
        for (uint64_t i = 0; i < n; i++) {
            bool integral;
            int64_t t = token_at(ix->dtype, buf, i, &integral);
            if (!integral || t < 0 || t >= vocab) {
                char val[64];
                if (integral)
                    snprintf(val, sizeof val, "%" PRId64, t);
                else
                    snprintf(val, sizeof val, "a non-integer %s", mt_token_dtype_name(ix->dtype));
                return mt_err_set(err, MT_ECORRUPT,
                                  "%s: token %s at position %" PRIu64 " of document %" PRIu64
                                  " (sequence %" PRIu64 ") is outside the vocabulary [0, %"
                                  PRId32 ")\nhint: set model%%vocab_size to the tokenizer's"
                                  " vocabulary (moetrain-preprocess: %d), or re-tokenize the"
                                  " data",
                                  ix->bin_path, val, off + done + i,
                                  mt_indexed_document_of(ix, seq), seq, vocab, MT_BYTE_VOCAB);
            }
            out[done + i] = (int32_t)t;
        }
    }
    return MT_OK;
}

/* ------------------------------------------------------------------------- */
/* Writer                                                                     */
/* ------------------------------------------------------------------------- */

struct mt_indexed_writer {
    char *prefix, *bin_tmp, *idx_tmp;
    FILE *bin;
    int dtype;
    size_t elem;
    int32_t *lengths;
    uint64_t n, cap;
    unsigned char *buf;
    size_t buf_cap;
};

static void writer_free(struct mt_indexed_writer *w)
{
    if (w->bin) fclose(w->bin);
    free(w->prefix);
    free(w->bin_tmp);
    free(w->idx_tmp);
    free(w->lengths);
    free(w->buf);
    free(w);
}

void mt_indexed_writer_abort(struct mt_indexed_writer *w)
{
    if (!w) return;
    if (w->bin_tmp) unlink(w->bin_tmp);
    if (w->idx_tmp) unlink(w->idx_tmp);
    writer_free(w);
}

int mt_indexed_writer_open(const char *prefix, enum mt_token_dtype dtype,
                           struct mt_indexed_writer **out, struct mt_err *err)
{
    *out = NULL;
    if (mt_token_dtype_size((int)dtype) == 0)
        return mt_err_set(err, MT_EINVAL, "unknown dtype code %d", (int)dtype);
    struct mt_indexed_writer *w = calloc(1, sizeof *w);
    if (!w) return mt_err_set(err, MT_ENOMEM, "out of memory");
    w->dtype = (int)dtype;
    w->elem = mt_token_dtype_size((int)dtype);
    w->prefix = strdup(prefix);
    w->bin_tmp = concat(prefix, ".bin.tmp");
    w->idx_tmp = concat(prefix, ".idx.tmp");
    if (!w->prefix || !w->bin_tmp || !w->idx_tmp) {
        writer_free(w);
        return mt_err_set(err, MT_ENOMEM, "out of memory");
    }
    w->bin = fopen(w->bin_tmp, "wb");
    if (!w->bin) {
        int rc = mt_err_errno(err, "%s", w->bin_tmp);
        writer_free(w);
        return rc;
    }
    *out = w;
    return MT_OK;
}

uint64_t mt_indexed_writer_documents(const struct mt_indexed_writer *w) { return w->n; }

static bool fits_dtype(int dtype, int32_t t)
{
    switch (dtype) {
    case MT_DTYPE_UINT8: return t >= 0 && t <= UINT8_MAX;
    case MT_DTYPE_INT8: return t >= INT8_MIN && t <= INT8_MAX;
    case MT_DTYPE_INT16: return t >= INT16_MIN && t <= INT16_MAX;
    case MT_DTYPE_UINT16: return t >= 0 && t <= UINT16_MAX;
    case MT_DTYPE_FLOAT32: return t > -(1 << 24) && t < (1 << 24);
    default: return true;
    }
}

static void store_token(int dtype, unsigned char *p, int32_t t)
{
    switch (dtype) {
    case MT_DTYPE_UINT8: case MT_DTYPE_INT8: *p = (unsigned char)t; break;
    case MT_DTYPE_INT16: { int16_t v = (int16_t)t; memcpy(p, &v, 2); break; }
    case MT_DTYPE_UINT16: { uint16_t v = (uint16_t)t; memcpy(p, &v, 2); break; }
    case MT_DTYPE_INT32: memcpy(p, &t, 4); break;
    case MT_DTYPE_INT64: { int64_t v = t; memcpy(p, &v, 8); break; }
    case MT_DTYPE_FLOAT32: { float v = (float)t; memcpy(p, &v, 4); break; }
    case MT_DTYPE_FLOAT64: { double v = t; memcpy(p, &v, 8); break; }
    default: break;
    }
}

int mt_indexed_writer_add(struct mt_indexed_writer *w, const int32_t *tokens, size_t n,
                          struct mt_err *err)
{
    if (n > INT32_MAX)
        return mt_err_set(err, MT_EINVAL,
                          "%s: document %" PRIu64 " has %zu tokens; the index format stores"
                          " lengths as int32",
                          w->prefix, w->n, n);
    if (n * w->elem > w->buf_cap) {
        unsigned char *b = realloc(w->buf, n * w->elem);
        if (!b) return mt_err_set(err, MT_ENOMEM, "out of memory");
        w->buf = b;
        w->buf_cap = n * w->elem;
    }
    for (size_t i = 0; i < n; i++) {
        if (!fits_dtype(w->dtype, tokens[i]))
            return mt_err_set(err, MT_EINVAL, "token %" PRId32 " does not fit dtype %s",
                              tokens[i], mt_token_dtype_name(w->dtype));
        store_token(w->dtype, w->buf + i * w->elem, tokens[i]);
    }
    if (w->n == w->cap) {
        uint64_t cap = w->cap ? 2 * w->cap : 1024;
        int32_t *l = realloc(w->lengths, cap * sizeof *l);
        if (!l) return mt_err_set(err, MT_ENOMEM, "out of memory");
        w->lengths = l;
        w->cap = cap;
    }
    if (n && fwrite(w->buf, w->elem, n, w->bin) != n)
        return mt_err_errno(err, "%s: write", w->bin_tmp);
    w->lengths[w->n++] = (int32_t)n;
    return MT_OK;
}

static int write_all(FILE *f, const void *p, size_t n, const char *path, struct mt_err *err)
{
    if (n && fwrite(p, 1, n, f) != n) return mt_err_errno(err, "%s: write", path);
    return MT_OK;
}

static int close_synced(FILE **f, const char *path, struct mt_err *err)
{
    int bad = fflush(*f) != 0 || fsync(fileno(*f)) != 0;
    int saved = errno;
    bad |= fclose(*f) != 0;
    *f = NULL;
    if (bad) {
        errno = saved ? saved : errno;
        return mt_err_errno(err, "%s: write", path);
    }
    return MT_OK;
}

static int write_index(struct mt_indexed_writer *w, struct mt_err *err)
{
    FILE *f = fopen(w->idx_tmp, "wb");
    if (!f) return mt_err_errno(err, "%s", w->idx_tmp);
    int rc;
    unsigned char hdr[IDX_HEADER_LEN];
    uint64_t version = 1, ndocidx = w->n + 1;
    memcpy(hdr, IDX_MAGIC, IDX_MAGIC_LEN);
    memcpy(hdr + 9, &version, 8);
    hdr[17] = (unsigned char)w->dtype;
    memcpy(hdr + 18, &w->n, 8);
    memcpy(hdr + 26, &ndocidx, 8);
    MT_CHECK_GOTO(write_all(f, hdr, sizeof hdr, w->idx_tmp, err), fail);
    MT_CHECK_GOTO(write_all(f, w->lengths, w->n * sizeof(int32_t), w->idx_tmp, err), fail);
    int64_t ptr = 0;
    for (uint64_t s = 0; s < w->n; s++) {
        MT_CHECK_GOTO(write_all(f, &ptr, 8, w->idx_tmp, err), fail);
        ptr += (int64_t)w->lengths[s] * (int64_t)w->elem;
    }
    for (uint64_t d = 0; d <= w->n; d++) {
        int64_t v = (int64_t)d;
        MT_CHECK_GOTO(write_all(f, &v, 8, w->idx_tmp, err), fail);
    }
    return close_synced(&f, w->idx_tmp, err);
fail:
    fclose(f);
    return rc;
}

/* fsync the directory holding path, so the renames survive a crash. */
static void sync_parent_dir(const char *path)
{
    char *dir = strdup(path);
    if (!dir) return;
    char *slash = strrchr(dir, '/');
    const char *d = ".";
    if (slash) {
        slash[slash == dir ? 1 : 0] = '\0';
        d = dir;
    }
    int fd = open(d, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(dir);
}

int mt_indexed_writer_finish(struct mt_indexed_writer *w, struct mt_err *err)
{
    int rc;
    char *bin = concat(w->prefix, ".bin"), *idx = concat(w->prefix, ".idx");
    if (!bin || !idx) {
        rc = mt_err_set(err, MT_ENOMEM, "out of memory");
        goto fail;
    }
    MT_CHECK_GOTO(close_synced(&w->bin, w->bin_tmp, err), fail);
    MT_CHECK_GOTO(write_index(w, err), fail);
    /* .bin first: until .idx is replaced, a reader sees the old pair or a
     * mismatch that validation rejects, never silently wrong data. */
    if (rename(w->bin_tmp, bin) != 0) {
        rc = mt_err_errno(err, "rename %s to %s", w->bin_tmp, bin);
        goto fail;
    }
    if (rename(w->idx_tmp, idx) != 0) {
        rc = mt_err_errno(err, "rename %s to %s", w->idx_tmp, idx);
        goto fail;
    }
    sync_parent_dir(idx);
    free(bin);
    free(idx);
    writer_free(w);
    return MT_OK;
fail:
    free(bin);
    free(idx);
    mt_indexed_writer_abort(w);
    return rc;
}
