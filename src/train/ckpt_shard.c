/* The sharded checkpoint format: shard files, the index, and reading slices that
 * overlap (see ckpt_shard.h). */
#include "train/ckpt_shard.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util/crc32.h"
#include "util/json.h"

#define DEFAULT_BLOCK ((size_t)16 << 20)

size_t mt_shard_block_bytes(void)
{
    static size_t cached;
    if (cached) return cached;
    size_t b = DEFAULT_BLOCK;
    const char *e = getenv("MOETRAIN_CKPT_BLOCK");
    if (e && *e) {
        char *end;
        unsigned long long x = strtoull(e, &end, 10);
        if (!*end && x >= 64 && x % 4 == 0 && x <= ((size_t)1 << 30)) b = (size_t)x;
    }
    cached = b;
    return b;
}

/* ---- memory accounting --------------------------------------------------- */

static size_t mem_now, mem_peak;

void mt_shard_mem_reset(void) { mem_peak = mem_now; }
size_t mt_shard_mem_peak(void) { return mem_peak; }

void mt_shard_mem_held(size_t n)
{
    mem_now += n;
    if (mem_now > mem_peak) mem_peak = mem_now;
}

void mt_shard_mem_released(size_t n) { mem_now -= n; }

void *mt_shard_malloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (p) mt_shard_mem_held(n);
    return p;
}

void mt_shard_free(void *p, size_t n)
{
    if (!p) return;
    free(p);
    mt_shard_mem_released(n);
}

/* ---- writing --------------------------------------------------------------- */

void mt_shard_whole_piece(struct mt_shard_piece *p, const char *prefix, const char *name,
                          int ndim, const long long *shape, float *data)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s%s", prefix, name);
    p->ndim = ndim;
    size_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (size_t)(p->shape[d] = shape[d]);
    p->hi = n;
    p->data = data;
}

static size_t box_numel(int ndim, const long long shape[4])
{
    size_t n = 1;
    for (int d = 0; d < ndim; d++) n *= (size_t)shape[d];
    return n;
}

static bool whole_box(const struct mt_shard_piece *p)
{
    return p->lo == 0 && p->hi == box_numel(p->ndim, p->shape);
}

/* The key of a piece in its file: the tensor's name, with @lo for a range of a box
 * (a file may hold several ranges of one tensor). */
static void piece_key(const struct mt_shard_piece *p, char *key, size_t len)
{
    if (whole_box(p)) snprintf(key, len, "%s", p->name);
    else snprintf(key, len, "%s@%zu", p->name, p->lo);
}

static void write_dims(FILE *f, int ndim, const long long *v)
{
    fputc('[', f);
    for (int d = 0; d < ndim; d++) fprintf(f, "%s%lld", d ? ", " : "", v[d]);
    fputc(']', f);
}

/* The safetensors header: {"KEY": {"dtype": "F32", "shape": [...], "data_offsets":
 * [a, b]}, ..., "__metadata__": {...}}, padded with spaces to a multiple of 8. */
static int make_header(const struct mt_shard_piece *p, int n, char **text, size_t *len,
                       struct mt_err *err)
{
    char *buf = NULL;
    size_t blen = 0;
    FILE *f = open_memstream(&buf, &blen);
    if (!f) return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    fputc('{', f);
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        char key[400];
        piece_key(&p[i], key, sizeof key);
        mt_json_write_string(f, key);
        fputs(": {\"dtype\": \"F32\", \"shape\": ", f);
        if (whole_box(&p[i])) {
            write_dims(f, p[i].ndim, p[i].shape);
        } else {
            long long len1 = (long long)(p[i].hi - p[i].lo);
            write_dims(f, 1, &len1);
        }
        uint64_t bytes = sizeof(float) * (p[i].hi - p[i].lo);
        fprintf(f, ", \"data_offsets\": [%" PRIu64 ", %" PRIu64 "]}, ", at, at + bytes);
        at += bytes;
    }
    fputs("\"__metadata__\": {\"format\": \"pt\", \"writer\": \"moetrain\"}}", f);
    while (ftell(f) % 8) fputc(' ', f);
    if (fclose(f) != 0) {
        free(buf);
        return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    }
    *text = buf;
    *len = blen;
    return MT_OK;
}

int mt_shard_write(const char *dir, const char *file, const struct mt_shard_piece *p, int n,
                   const struct mt_kernels *k, size_t block, FILE *slices, struct mt_err *err)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    char *header = NULL;
    size_t hlen = 0;
    MT_CHECK(make_header(p, n, &header, &hlen, err));
    size_t largest = sizeof(float);
    for (int i = 0; i < n; i++)
        if (sizeof(float) * (p[i].hi - p[i].lo) > largest)
            largest = sizeof(float) * (p[i].hi - p[i].lo);
    const size_t bufbytes = block < largest ? block : largest;
    float *buf = mt_shard_malloc(bufbytes);
    FILE *f = fopen(path, "wb");
    int rc = MT_OK;
    if (!buf) rc = mt_err_set(err, MT_ENOMEM, "checkpoint: no memory for a %zu-byte buffer",
                              bufbytes);
    else if (!f) rc = mt_err_errno(err, "checkpoint: cannot create '%s'", path);
    if (rc) goto out;
    bool ok = true;
    uint64_t hl = hlen;
    ok = fwrite(&hl, 8, 1, f) == 1 && fwrite(header, 1, hlen, f) == hlen;
    uint64_t offset = 8 + hlen;
    const size_t per = block / sizeof(float);
    for (int i = 0; ok && i < n; i++) {
        const size_t total = p[i].hi - p[i].lo;
        char key[400];
        piece_key(&p[i], key, sizeof key);
        fputs("\n    {\"tensor\": ", slices);
        mt_json_write_string(slices, p[i].name);
        fputs(", \"file\": ", slices);
        mt_json_write_string(slices, file);
        fputs(", \"key\": ", slices);
        mt_json_write_string(slices, key);
        fputs(", \"start\": ", slices);
        write_dims(slices, p[i].ndim, p[i].start);
        fputs(", \"shape\": ", slices);
        write_dims(slices, p[i].ndim, p[i].shape);
        fprintf(slices, ", \"range\": [%zu, %zu], \"offset\": %" PRIu64 ", \"bytes\": %zu, "
                "\"crc32\": [", p[i].lo, p[i].hi, offset, sizeof(float) * total);
        for (size_t at = 0; ok && at < total; at += per) {
            size_t m = total - at < per ? total - at : per;
            if (p[i].backend) k->op.copy(k->ctx, buf, p[i].data + at, sizeof(float) * m);
            else memcpy(buf, p[i].data + at, sizeof(float) * m);
            fprintf(slices, "%s%" PRIu32, at ? ", " : "", mt_crc32(0, buf, sizeof(float) * m));
            ok = fwrite(buf, sizeof(float), m, f) == m;
        }
        fputs("]},", slices);
        offset += sizeof(float) * total;
    }
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok = fclose(f) == 0 && ok;
    f = NULL;
    if (!ok) rc = mt_err_errno(err, "checkpoint: writing '%s' failed", path);
out:
    if (f) fclose(f);
    mt_shard_free(buf, bufbytes);
    free(header);
    return rc;
}

static void write_tensor_entry(FILE *f, const char *prefix, const char *name, int ndim,
                               const long long *shape, bool *first)
{
    fputs(*first ? "\n    {\"name\": " : ",\n    {\"name\": ", f);
    *first = false;
    char full[400];
    snprintf(full, sizeof full, "%s%s", prefix, name);
    mt_json_write_string(f, full);
    fputs(", \"dtype\": \"F32\", \"shape\": ", f);
    write_dims(f, ndim, shape);
    fputc('}', f);
}

int mt_shard_write_index(const char *dir, const struct mt_ckpt_view *table,
                         const struct mt_train_state *st, const char *layout_json,
                         size_t block, const char *slices, size_t slices_len,
                         struct mt_err *err)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", dir, MT_SHARD_INDEX);
    FILE *f = fopen(path, "w");
    if (!f) return mt_err_errno(err, "checkpoint: cannot create '%s'", path);
    fprintf(f, "{\"format\": \"%s\", \"version\": %d,\n", MT_SHARD_FORMAT, MT_SHARD_VERSION);
    fprintf(f, " \"state\": {\"iteration\": %lld, \"consumed_samples\": %lld, \"eval_count\": "
            "%lld, \"skipped_iters\": %lld, \"adam_step\": %lld},\n",
            st->iteration, st->consumed_samples, st->eval_count, st->skipped_iters,
            st->adam_step);
    fprintf(f, " \"layout\": %s,\n \"config\": \"config.nml\",\n", layout_json);
    fprintf(f, " \"checksum\": \"crc32\", \"block_bytes\": %zu,\n \"tensors\": [", block);
    bool first = true;
    static const char *const prefixes[3] = {"", MT_SHARD_PREFIX_M, MT_SHARD_PREFIX_V};
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < table->ntensors; i++)
            write_tensor_entry(f, prefixes[k], table->names[i], table->ndims[i],
                               table->shapes[i], &first);
    if (table->nbuffers) {
        long long nb = (long long)table->nbuffers;
        write_tensor_entry(f, "", MT_SHARD_BIAS, 1, &nb, &first);
    }
    fputs("],\n \"slices\": [", f);
    /* every entry is followed by a comma: all but the last are kept */
    if (slices_len) fwrite(slices, 1, slices_len - 1, f);
    fputs("]}\n", f);
    bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0 && !ferror(f);
    ok = fclose(f) == 0 && ok;
    if (!ok) return mt_err_errno(err, "checkpoint: writing '%s' failed", path);
    return MT_OK;
}

/* ---- the index, parsed ---------------------------------------------------------- */

struct slice {
    int file;
    long long start[4], shape[4];
    size_t lo, hi;
    uint64_t offset;
    uint32_t *crc;             /* per block; NULL: verified otherwise (state.bin) or not
                                * at all (a Hugging Face file) */
    size_t ncrc;
    enum mt_shard_dtype dtype; /* how its elements are stored */
};

struct tensor {
    char *name;
    int ndim;
    long long shape[4];
    int n, cap;
    struct slice *s;
};

struct mt_shard_index {
    char dir[4200];
    char layout[512];
    bool single;               /* a one-process state.bin */
    size_t block;
    struct mt_train_state st;
    int nfiles;
    char **files;
    int *fds;
    int nt, tcap;              /* tensors, and room for them in t */
    struct tensor *t;
    /* parameter table (mt_shard_index_table) */
    int nparams_t;
    const char **pnames;
    int *pndims;
    long long (*pshapes)[4];
    size_t nbuffers;
};

void mt_shard_index_free(struct mt_shard_index *ix)
{
    if (!ix) return;
    for (int i = 0; i < ix->nfiles; i++) {
        free(ix->files[i]);
        if (ix->fds && ix->fds[i] >= 0) close(ix->fds[i]);
    }
    free(ix->files);
    free(ix->fds);
    for (int i = 0; i < ix->nt; i++) {
        for (int j = 0; j < ix->t[i].n; j++) free(ix->t[i].s[j].crc);
        free(ix->t[i].s);
        free(ix->t[i].name);
    }
    free(ix->t);
    free(ix->pnames);
    free(ix->pndims);
    free(ix->pshapes);
    free(ix);
}

const struct mt_train_state *mt_shard_index_state(const struct mt_shard_index *ix)
{
    return &ix->st;
}

const char *mt_shard_index_layout(const struct mt_shard_index *ix) { return ix->layout; }

static int bad_index(struct mt_err *err, const struct mt_shard_index *ix, const char *what)
{
    return mt_err_set(err, MT_ECORRUPT,
                      "checkpoint '%s/%s' is corrupt: %s. Load an older checkpoint (set "
                      "checkpoint%%load to its iter_* directory) or start without load",
                      ix->dir, MT_SHARD_INDEX, what);
}

static int cmp_tensor(const void *a, const void *b)
{
    return strcmp(((const struct tensor *)a)->name, ((const struct tensor *)b)->name);
}

static struct tensor *find(const struct mt_shard_index *ix, const char *name)
{
    struct tensor key = { .name = (char *)name };
    return bsearch(&key, ix->t, (size_t)ix->nt, sizeof *ix->t, cmp_tensor);
}

static int add_slice(struct tensor *t, const struct slice *s)
{
    if (t->n == t->cap) {
        int nc = t->cap ? 2 * t->cap : 4;
        struct slice *g = realloc(t->s, (size_t)nc * sizeof *g);
        if (!g) return MT_ENOMEM;
        t->s = g;
        t->cap = nc;
    }
    t->s[t->n++] = *s;
    return MT_OK;
}

/* dims of an array of non-negative integers (at most 4). */
static bool get_dims(const struct mt_json *a, int *ndim, long long out[4])
{
    if (!a || a->type != MT_JSON_ARRAY || a->n < 1 || a->n > 4) return false;
    for (size_t d = 0; d < 4; d++) out[d] = 0;
    for (size_t d = 0; d < a->n; d++)
        if (!mt_json_int(&a->items[d], 0, (long long)1 << 48, &out[d])) return false;
    *ndim = (int)a->n;
    return true;
}

static int file_id(struct mt_shard_index *ix, const char *name, int *id)
{
    for (int i = 0; i < ix->nfiles; i++)
        if (!strcmp(ix->files[i], name)) {
            *id = i;
            return MT_OK;
        }
    char **g = realloc(ix->files, (size_t)(ix->nfiles + 1) * sizeof *g);
    if (!g) return MT_ENOMEM;
    ix->files = g;
    if (!(ix->files[ix->nfiles] = strdup(name))) return MT_ENOMEM;
    *id = ix->nfiles++;
    return MT_OK;
}

static int set_param_table(struct mt_shard_index *ix, size_t n, struct mt_err *err)
{
    ix->pnames = calloc(n + 1, sizeof *ix->pnames);
    ix->pndims = calloc(n + 1, sizeof *ix->pndims);
    ix->pshapes = calloc(n + 1, sizeof *ix->pshapes);
    if (!ix->pnames || !ix->pndims || !ix->pshapes)
        return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    return MT_OK;
}

static int parse_index(struct mt_shard_index *ix, const struct mt_json *root, struct mt_err *err)
{
    const struct mt_json *fmt = mt_json_get(root, "format");
    long long version;
    if (!fmt || fmt->type != MT_JSON_STRING || strcmp(fmt->string, MT_SHARD_FORMAT))
        return bad_index(err, ix, "it does not name the format \"" MT_SHARD_FORMAT "\"");
    if (!mt_json_int(mt_json_get(root, "version"), 0, 1 << 30, &version) ||
        version != MT_SHARD_VERSION)
        return mt_err_set(err, MT_ECORRUPT,
                          "checkpoint '%s/%s' has format version %lld; this moetrain reads "
                          "version %d",
                          ix->dir, MT_SHARD_INDEX, mt_json_get(root, "version") &&
                          mt_json_get(root, "version")->is_int ?
                          mt_json_get(root, "version")->integer : -1LL, MT_SHARD_VERSION);
    const struct mt_json *st = mt_json_get(root, "state");
    long long *dst[5] = {&ix->st.iteration, &ix->st.consumed_samples, &ix->st.eval_count,
                         &ix->st.skipped_iters, &ix->st.adam_step};
    static const char *const keys[5] = {"iteration", "consumed_samples", "eval_count",
                                        "skipped_iters", "adam_step"};
    for (int i = 0; i < 5; i++)
        if (!mt_json_int(mt_json_get(st, keys[i]), 0, INT64_MAX, dst[i]))
            return bad_index(err, ix, "its \"state\" lacks a counter");
    long long block;
    if (!mt_json_int(mt_json_get(root, "block_bytes"), 4, (long long)1 << 30, &block) ||
        block % 4)
        return bad_index(err, ix, "\"block_bytes\" is missing or not a multiple of 4");
    ix->block = (size_t)block;
    const struct mt_json *lay = mt_json_get(root, "layout");
    if (lay && lay->type == MT_JSON_OBJECT) {
        size_t at = 0;
        for (size_t i = 0; i < lay->n && at + 40 < sizeof ix->layout; i++)
            if (lay->items[i].type == MT_JSON_NUMBER || lay->items[i].type == MT_JSON_BOOL)
                at += (size_t)snprintf(ix->layout + at, sizeof ix->layout - at, "%s%s %g",
                                       at ? ", " : "", lay->keys[i],
                                       lay->items[i].type == MT_JSON_BOOL
                                           ? (double)lay->items[i].boolean
                                           : lay->items[i].number);
    }
    const struct mt_json *tensors = mt_json_get(root, "tensors");
    const struct mt_json *slices = mt_json_get(root, "slices");
    if (!tensors || tensors->type != MT_JSON_ARRAY || !slices || slices->type != MT_JSON_ARRAY)
        return bad_index(err, ix, "it lacks the \"tensors\" or \"slices\" list");
    ix->t = calloc(tensors->n + 1, sizeof *ix->t);
    if (!ix->t) return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    ix->tcap = (int)tensors->n + 1;
    MT_CHECK(set_param_table(ix, tensors->n, err));
    for (size_t i = 0; i < tensors->n; i++) {
        const struct mt_json *e = &tensors->items[i];
        const struct mt_json *name = mt_json_get(e, "name"), *dt = mt_json_get(e, "dtype");
        struct tensor *t = &ix->t[ix->nt];
        if (!name || name->type != MT_JSON_STRING || !dt || dt->type != MT_JSON_STRING ||
            !get_dims(mt_json_get(e, "shape"), &t->ndim, t->shape))
            return bad_index(err, ix, "an entry of \"tensors\" lacks a name, dtype or shape");
        if (strcmp(dt->string, "F32"))
            return mt_err_set(err, MT_EUNSUPPORTED,
                              "checkpoint '%s': tensor '%s' has dtype %s; moetrain "
                              "checkpoints hold F32",
                              ix->dir, name->string, dt->string);
        if (!(t->name = strdup(name->string)))
            return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
        ix->nt++;
        if (!strcmp(t->name, MT_SHARD_BIAS)) {
            ix->nbuffers = (size_t)t->shape[0];
        } else if (strncmp(t->name, "optimizer.", 10)) {
            ix->pnames[ix->nparams_t] = t->name;
            ix->pndims[ix->nparams_t] = t->ndim;
            memcpy(ix->pshapes[ix->nparams_t], t->shape, sizeof t->shape);
            ix->nparams_t++;
        }
    }
    qsort(ix->t, (size_t)ix->nt, sizeof *ix->t, cmp_tensor);
    for (int i = 1; i < ix->nt; i++)
        if (!strcmp(ix->t[i].name, ix->t[i - 1].name))
            return bad_index(err, ix, "a tensor is listed twice");
    for (size_t i = 0; i < slices->n; i++) {
        const struct mt_json *e = &slices->items[i];
        const struct mt_json *tn = mt_json_get(e, "tensor"), *fn = mt_json_get(e, "file");
        const struct mt_json *range = mt_json_get(e, "range"), *crc = mt_json_get(e, "crc32");
        struct slice s = { 0 };
        int nd = 0, nd2 = 0;
        long long off, bytes, lo, hi;
        if (!tn || tn->type != MT_JSON_STRING || !fn || fn->type != MT_JSON_STRING ||
            !get_dims(mt_json_get(e, "start"), &nd, s.start) ||
            !get_dims(mt_json_get(e, "shape"), &nd2, s.shape) || nd != nd2 || !range ||
            range->type != MT_JSON_ARRAY || range->n != 2 ||
            !mt_json_int(&range->items[0], 0, INT64_MAX, &lo) ||
            !mt_json_int(&range->items[1], lo, INT64_MAX, &hi) ||
            !mt_json_int(mt_json_get(e, "offset"), 8, INT64_MAX, &off) ||
            !mt_json_int(mt_json_get(e, "bytes"), 0, INT64_MAX, &bytes) || !crc ||
            crc->type != MT_JSON_ARRAY)
            return bad_index(err, ix, "an entry of \"slices\" is incomplete");
        struct tensor *t = find(ix, tn->string);
        if (!t) return bad_index(err, ix, "a slice names a tensor not in \"tensors\"");
        char what[600];
        bool fits = nd == t->ndim && bytes == (hi - lo) * 4 &&
                    (size_t)hi <= box_numel(nd, s.shape);
        for (int d = 0; fits && d < nd; d++) fits = s.start[d] + s.shape[d] <= t->shape[d];
        if (!fits) {
            snprintf(what, sizeof what, "a slice of '%.400s' lies outside the tensor", t->name);
            return bad_index(err, ix, what);
        }
        const char *file = fn->string;
        if (!file[0] || strchr(file, '/') || !strcmp(file, ".") || !strcmp(file, ".."))
            return bad_index(err, ix, "a slice names a file outside the checkpoint directory");
        size_t nblocks = ((size_t)bytes + ix->block - 1) / ix->block;
        if (crc->n != nblocks) {
            snprintf(what, sizeof what, "a slice of '%.400s' has %zu checksums for %zu blocks",
                     t->name, crc->n, nblocks);
            return bad_index(err, ix, what);
        }
        s.lo = (size_t)lo;
        s.hi = (size_t)hi;
        s.offset = (uint64_t)off;
        s.ncrc = nblocks;
        s.crc = malloc(sizeof(uint32_t) * (nblocks ? nblocks : 1));
        if (!s.crc || file_id(ix, file, &s.file) || add_slice(t, &s)) {
            free(s.crc);
            return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
        }
        for (size_t b = 0; b < nblocks; b++) {
            long long c;
            if (!mt_json_int(&crc->items[b], 0, UINT32_MAX, &c))
                return bad_index(err, ix, "a checksum is not a 32-bit number");
            s.crc[b] = (uint32_t)c;
        }
    }
    return MT_OK;
}

/* ---- the one-process format, seen as an index ------------------------------------------ */

static int read_exact(int fd, void *p, size_t n, uint64_t off)
{
    unsigned char *b = p;
    while (n) {
        ssize_t got = pread(fd, b, n, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return got == 0 ? MT_ECORRUPT : MT_EIO;
        b += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return MT_OK;
}

static int single_corrupt(struct mt_err *err, const char *path, const char *what)
{
    return mt_err_set(err, MT_ECORRUPT,
                      "checkpoint '%s' is corrupt: %s. Load an older checkpoint (set "
                      "checkpoint%%load to its iter_* directory) or start without load",
                      path, what);
}

int mt_shard_index_text(const char *iter_dir, char **text, size_t *len, struct mt_err *err)
{
    char path[4400];
    *text = NULL;
    *len = 0;
    snprintf(path, sizeof path, "%s/%s", iter_dir, MT_SHARD_INDEX);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        struct stat sb;
        int rc = MT_OK;
        if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > ((off_t)1 << 34))
            rc = mt_err_set(err, MT_ECORRUPT, "checkpoint: '%s' is not a regular file", path);
        else if (!(*text = malloc((size_t)sb.st_size + 1)))
            rc = mt_err_set(err, MT_ENOMEM, "checkpoint: no memory to read '%s'", path);
        else if (read_exact(fd, *text, (size_t)sb.st_size, 0))
            rc = mt_err_errno(err, "checkpoint: reading '%s' failed", path);
        close(fd);
        if (rc) {
            free(*text);
            *text = NULL;
            return rc;
        }
        *len = (size_t)sb.st_size;
        return MT_OK;
    }
    if (errno != ENOENT) return mt_err_errno(err, "checkpoint: cannot open '%s'", path);
    /* a one-process state.bin: its whole checksum, streamed */
    snprintf(path, sizeof path, "%s/state.bin", iter_dir);
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return mt_err_errno(err, "checkpoint: cannot open '%s'", path);
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return mt_err_set(err, MT_ECORRUPT, "checkpoint: '%s' is not a regular file", path);
    }
    const size_t block = mt_shard_block_bytes();
    unsigned char *buf = mt_shard_malloc(block);
    if (!buf) {
        close(fd);
        return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    }
    int rc = MT_OK;
    uint64_t size = (uint64_t)sb.st_size, h = 0xcbf29ce484222325ull, stored = 0;
    if (size < 16) rc = single_corrupt(err, path, "the file is truncated");
    for (uint64_t at = 0; rc == MT_OK && at < size - 8; at += block) {
        size_t n = size - 8 - at < block ? (size_t)(size - 8 - at) : block;
        if (read_exact(fd, buf, n, at)) rc = mt_err_errno(err, "checkpoint: reading '%s'", path);
        else h = mt_ckpt_fnv1a(h, buf, n);
    }
    if (rc == MT_OK && read_exact(fd, &stored, 8, size - 8))
        rc = mt_err_errno(err, "checkpoint: reading '%s'", path);
    if (rc == MT_OK && h != stored)
        rc = single_corrupt(err, path,
                            "the checksum does not match (truncated or damaged file)");
    mt_shard_free(buf, block);
    close(fd);
    return rc;
}

/* Reads state.bin's header and tensor table into ix: each tensor's parameters and both
 * moments one slice each, the expert biases one more. */
static int open_single(struct mt_shard_index *ix, struct mt_err *err)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/state.bin", ix->dir);
    FILE *f = fopen(path, "rb");
    if (!f) return mt_err_errno(err, "checkpoint: cannot open '%s'", path);
    struct stat sb;
    uint64_t h[11];
    char magic[8];
    int rc = MT_OK;
    if (fstat(fileno(f), &sb) != 0 || fread(magic, 8, 1, f) != 1 ||
        memcmp(magic, MT_CKPT1_MAGIC, 8) != 0) {
        fclose(f);
        return single_corrupt(err, path, "it does not start with the moetrain checkpoint magic");
    }
    if (fread(h, 8, 9, f) != 9) {
        fclose(f);
        return single_corrupt(err, path, "the header is truncated");
    }
    if (h[0] != MT_CKPT1_VERSION) {
        fclose(f);
        return mt_err_set(err, MT_ECORRUPT,
                          "checkpoint '%s' has format version %" PRIu64
                          "; this moetrain reads version %u",
                          path, h[0], MT_CKPT1_VERSION);
    }
    ix->st = (struct mt_train_state){(long long)h[1], (long long)h[2], (long long)h[3],
                                     (long long)h[4], (long long)h[5]};
    uint64_t ntensors = h[6], nparams = h[7], nbuffers = h[8];
    uint64_t size = (uint64_t)sb.st_size;
    if (ntensors > 1000000 || nparams > size / 12 || nbuffers > size / 4) {
        fclose(f);
        return single_corrupt(err, path, "its header is not a moetrain checkpoint's");
    }
    snprintf(ix->layout, sizeof ix->layout, "one process (state.bin)");
    ix->single = true;
    ix->block = mt_shard_block_bytes();
    ix->nfiles = 1;
    ix->files = calloc(1, sizeof *ix->files);
    ix->t = calloc(3 * ntensors + 2, sizeof *ix->t);
    ix->tcap = (int)(3 * ntensors + 2);
    if (!ix->files || !ix->t || !(ix->files[0] = strdup("state.bin")) ||
        set_param_table(ix, ntensors, err)) {
        fclose(f);
        return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    }
    uint64_t at = 0;
    size_t *starts = calloc(ntensors + 1, sizeof *starts);
    if (!starts) rc = mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    for (uint64_t i = 0; rc == MT_OK && i < ntensors; i++) {
        uint64_t len, nd, shape[4];
        char name[4096];
        if (fread(&len, 8, 1, f) != 1 || len >= sizeof name || fread(name, 1, len, f) != len ||
            fread(&nd, 8, 1, f) != 1 || fread(shape, 8, 4, f) != 4 || nd < 1 || nd > 4) {
            rc = single_corrupt(err, path, "the tensor table is truncated");
            break;
        }
        name[len] = '\0';
        static const char *const prefixes[3] = {"", MT_SHARD_PREFIX_M, MT_SHARD_PREFIX_V};
        for (int k = 0; k < 3; k++) {
            struct tensor *t = &ix->t[3 * i + (uint64_t)k];
            char full[4200];
            snprintf(full, sizeof full, "%s%s", prefixes[k], name);
            t->name = strdup(full);
            t->ndim = (int)nd;
            for (int d = 0; d < 4; d++) t->shape[d] = d < (int)nd ? (long long)shape[d] : 0;
            if (!t->name) rc = mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
        }
        if (rc) break;
        const struct tensor *t = &ix->t[3 * i];
        ix->pnames[i] = t->name;
        ix->pndims[i] = t->ndim;
        memcpy(ix->pshapes[i], t->shape, sizeof t->shape);
        starts[i] = (size_t)at;
        at += box_numel(t->ndim, t->shape);
        ix->nt += 3;
        ix->nparams_t++;
    }
    uint64_t data0 = (uint64_t)ftell(f);
    fclose(f);
    if (rc == MT_OK && at != nparams)
        rc = single_corrupt(err, path, "its tensor table does not add up to its size");
    if (rc == MT_OK && data0 + (3 * nparams + nbuffers) * 4 + 8 != size)
        rc = single_corrupt(err, path, "its size does not match its header");
    for (int i = 0; rc == MT_OK && i < ix->nparams_t; i++) {
        for (int k = 0; k < 3; k++) {
            struct tensor *t = &ix->t[3 * i + k];
            struct slice s = { .file = 0, .lo = 0, .hi = box_numel(t->ndim, t->shape) };
            memcpy(s.shape, t->shape, sizeof s.shape);
            s.offset = data0 + 4 * ((uint64_t)k * nparams + starts[i]);
            if (add_slice(t, &s)) rc = mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
        }
    }
    free(starts);
    if (rc == MT_OK && nbuffers) {
        struct tensor *t = &ix->t[ix->nt++];
        struct slice s = { .file = 0, .lo = 0, .hi = nbuffers, .offset = data0 + 12 * nparams };
        t->name = strdup(MT_SHARD_BIAS);
        t->ndim = 1;
        t->shape[0] = s.shape[0] = (long long)nbuffers;
        ix->nbuffers = nbuffers;
        if (!t->name || add_slice(t, &s))
            rc = mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    }
    if (rc == MT_OK) qsort(ix->t, (size_t)ix->nt, sizeof *ix->t, cmp_tensor);
    return rc;
}

int mt_shard_index_open(const char *iter_dir, const char *text, size_t len,
                        struct mt_shard_index **out, struct mt_err *err)
{
    *out = NULL;
    struct mt_shard_index *ix = calloc(1, sizeof *ix);
    if (!ix) return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    snprintf(ix->dir, sizeof ix->dir, "%s", iter_dir);
    int rc;
    if (text) {
        char what[4400];
        snprintf(what, sizeof what, "checkpoint '%s/%s'", iter_dir, MT_SHARD_INDEX);
        struct mt_json *root = NULL;
        rc = mt_json_parse(text, len, what, &root, err);
        if (rc == MT_OK) rc = parse_index(ix, root, err);
        size_t l = strlen(err->msg);
        if (rc == MT_ECORRUPT && !strstr(err->msg, "older checkpoint"))
            snprintf(err->msg + l, sizeof err->msg - l, ". Load an older checkpoint (set "
                     "checkpoint%%load to its iter_* directory) or start without load");
        mt_json_free(root);
    } else {
        rc = open_single(ix, err);
    }
    if (rc == MT_OK) {
        ix->fds = malloc(sizeof(int) * (size_t)(ix->nfiles ? ix->nfiles : 1));
        if (!ix->fds) rc = mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
        for (int i = 0; rc == MT_OK && i < ix->nfiles; i++) ix->fds[i] = -1;
    }
    if (rc) {
        mt_shard_index_free(ix);
        return rc;
    }
    *out = ix;
    return MT_OK;
}

void mt_shard_index_table(const struct mt_shard_index *ix, struct mt_ckpt_view *table)
{
    memset(table, 0, sizeof *table);
    table->ntensors = ix->nparams_t;
    table->names = ix->pnames;
    table->ndims = ix->pndims;
    table->shapes = (const long long (*)[4])ix->pshapes;
    table->nbuffers = ix->nbuffers;
    for (int i = 0; i < ix->nparams_t; i++)
        table->nparams += box_numel(ix->pndims[i], ix->pshapes[i]);
}

int mt_shard_index_check(const struct mt_shard_index *ix, const struct mt_ckpt_view *table,
                         struct mt_err *err)
{
    static const char *const hint =
        "the &model or &moe settings differ from the run that saved it (its config.nml "
        "shows them)";
    int expected = 3 * table->ntensors + (table->nbuffers ? 1 : 0);
    static const char *const prefixes[3] = {"", MT_SHARD_PREFIX_M, MT_SHARD_PREFIX_V};
    for (int k = 0; k < 3; k++) {
        for (int i = 0; i < table->ntensors; i++) {
            char name[400];
            snprintf(name, sizeof name, "%s%s", prefixes[k], table->names[i]);
            const struct tensor *t = find(ix, name);
            if (!t)
                return mt_err_set(err, MT_EINVAL,
                                  "checkpoint '%s' has no tensor '%s' that this model has: %s",
                                  ix->dir, name, hint);
            bool same = t->ndim == table->ndims[i];
            for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == table->shapes[i][d];
            if (!same)
                return mt_err_set(err, MT_EINVAL,
                                  "checkpoint '%s': tensor '%s' is [%lld,%lld,%lld,%lld] there "
                                  "but [%lld,%lld,%lld,%lld] in this model: %s",
                                  ix->dir, name, t->shape[0], t->shape[1], t->shape[2],
                                  t->shape[3], table->shapes[i][0], table->shapes[i][1],
                                  table->shapes[i][2], table->shapes[i][3], hint);
        }
    }
    if (table->nbuffers != ix->nbuffers)
        return mt_err_set(err, MT_EINVAL,
                          "checkpoint '%s' holds %zu values of its buffers (%s: the expert "
                          "biases, then the FP8/FP4 recipes' state), but this model has %zu "
                          "(&precision fp8_format, fp8_recipe, fp8_amax_history_len and "
                          "fp4_format decide that state's size): %s",
                          ix->dir, ix->nbuffers, MT_SHARD_BIAS, table->nbuffers, hint);
    if (ix->nt != expected) {
        /* name one tensor the model does not have */
        for (int i = 0; i < ix->nt; i++) {
            const char *n = ix->t[i].name;
            if (!strncmp(n, MT_SHARD_PREFIX_M, strlen(MT_SHARD_PREFIX_M)))
                n += strlen(MT_SHARD_PREFIX_M);
            else if (!strncmp(n, MT_SHARD_PREFIX_V, strlen(MT_SHARD_PREFIX_V)))
                n += strlen(MT_SHARD_PREFIX_V);
            bool known = !strcmp(n, MT_SHARD_BIAS);
            for (int j = 0; !known && j < table->ntensors; j++) known = !strcmp(n, table->names[j]);
            if (!known)
                return mt_err_set(err, MT_EINVAL,
                                  "checkpoint '%s' holds tensor '%s', which this model does not "
                                  "have: %s",
                                  ix->dir, ix->t[i].name, hint);
        }
        return mt_err_set(err, MT_EINVAL, "checkpoint '%s' holds %d tensors, this model %d: %s",
                          ix->dir, ix->nt, expected, hint);
    }
    return MT_OK;
}

/* ---- reading what overlaps ------------------------------------------------------- */

struct box {
    int nd;
    long long lo[4], hi[4];
};

static size_t flat(const long long *start, const long long *shape, int nd, const long long *g)
{
    size_t f = 0;
    for (int d = 0; d < nd; d++) f = f * (size_t)shape[d] + (size_t)(g[d] - start[d]);
    return f;
}

/* Copies the elements both have: the source is slice s's elements [c0, c1) at src, the
 * destination target t's [t->lo, t->hi) at t->data. Returns how many were copied. */
static size_t copy_overlap(const struct slice *s, size_t c0, size_t c1, const float *src,
                           const struct mt_shard_piece *t)
{
    const int nd = t->ndim;
    struct box I = { nd, { 0 }, { 0 } };
    for (int d = 0; d < nd; d++) {
        long long a = s->start[d] > t->start[d] ? s->start[d] : t->start[d];
        long long b0 = s->start[d] + s->shape[d], b1 = t->start[d] + t->shape[d];
        I.lo[d] = a;
        I.hi[d] = b0 < b1 ? b0 : b1;
        if (I.lo[d] >= I.hi[d]) return 0;
    }
    /* the rows of s that [c0, c1) touches bound the first dimension */
    size_t row = 1;
    for (int d = 1; d < nd; d++) row *= (size_t)s->shape[d];
    long long r0 = s->start[0] + (long long)(c0 / row);
    long long r1 = s->start[0] + (long long)((c1 - 1) / row) + 1;
    if (I.lo[0] < r0) I.lo[0] = r0;
    if (I.hi[0] > r1) I.hi[0] = r1;
    if (I.lo[0] >= I.hi[0]) return 0;
    const long long len = I.hi[nd - 1] - I.lo[nd - 1];
    long long g[4];
    memcpy(g, I.lo, sizeof g);
    size_t copied = 0;
    for (;;) {
        size_t s0 = flat(s->start, s->shape, nd, g), n0 = flat(t->start, t->shape, nd, g);
        long long j0 = 0, j1 = len;
        if ((long long)c0 - (long long)s0 > j0) j0 = (long long)c0 - (long long)s0;
        if ((long long)t->lo - (long long)n0 > j0) j0 = (long long)t->lo - (long long)n0;
        if ((long long)c1 - (long long)s0 < j1) j1 = (long long)c1 - (long long)s0;
        if ((long long)t->hi - (long long)n0 < j1) j1 = (long long)t->hi - (long long)n0;
        if (j0 < j1) {
            memcpy(t->data + (n0 + (size_t)j0 - t->lo), src + (s0 + (size_t)j0 - c0),
                   sizeof(float) * (size_t)(j1 - j0));
            copied += (size_t)(j1 - j0);
        }
        int d = nd - 2;
        for (; d >= 0; d--) {
            if (++g[d] < I.hi[d]) break;
            g[d] = I.lo[d];
        }
        if (d < 0) break;
    }
    return copied;
}

static int open_file(struct mt_shard_index *ix, int id, struct mt_err *err)
{
    if (ix->fds[id] >= 0) return MT_OK;
    char path[4400];
    snprintf(path, sizeof path, "%s/%s", ix->dir, ix->files[id]);
    ix->fds[id] = open(path, O_RDONLY | O_CLOEXEC);
    if (ix->fds[id] < 0)
        return mt_err_errno(err, "checkpoint '%s': cannot open its file '%s' (an incomplete "
                            "copy of the checkpoint? load an older one)",
                            ix->dir, ix->files[id]);
    return MT_OK;
}

/* bf16 values read into the first 2n bytes of buf become n floats (from the last, so
 * that none is overwritten before it is read). */
static void bf16_widen(float *buf, size_t n)
{
    const uint16_t *h = (const uint16_t *)buf;
    for (size_t i = n; i-- > 0;) {
        uint32_t u = (uint32_t)h[i] << 16;
        memcpy(&buf[i], &u, sizeof u);
    }
}

/* Reads the blocks of slice s that hold its elements [f0, f1) and copies what target t
 * needs; *copied counts it. */
static int read_slice(struct mt_shard_index *ix, const struct tensor *T, const struct slice *s,
                      size_t f0, size_t f1, const struct mt_shard_piece *t, float *buf,
                      size_t *copied, struct mt_err *err)
{
    MT_CHECK(open_file(ix, s->file, err));
    const size_t per = ix->block / sizeof(float);
    const size_t total = s->hi - s->lo;
    const size_t elem = s->dtype == MT_SHARD_BF16 ? 2 : 4;
    /* slice-relative element ranges, block-aligned when blocks carry checksums */
    size_t a = f0 - s->lo, e = f1 - s->lo;
    if (s->crc) a -= a % per;
    for (size_t at = a; at < e; at += per) {
        size_t n = total - at < per ? total - at : per;
        uint64_t off = s->offset + elem * (uint64_t)at;
        int rc = read_exact(ix->fds[s->file], buf, elem * n, off);
        if (rc == MT_EIO)
            return mt_err_errno(err, "checkpoint '%s': reading '%s' failed", ix->dir,
                                ix->files[s->file]);
        if (rc)
            return mt_err_set(err, MT_ECORRUPT,
                              "checkpoint '%s' is corrupt: '%s' ends before the data of "
                              "tensor '%s' (bytes %" PRIu64 "..%" PRIu64 "): a truncated "
                              "file. Load an older checkpoint (set checkpoint%%load to its "
                              "iter_* directory) or start without load",
                              ix->dir, ix->files[s->file], T->name, off,
                              off + elem * (uint64_t)n);
        if (s->dtype == MT_SHARD_BF16) bf16_widen(buf, n);
        if (s->crc && mt_crc32(0, buf, sizeof(float) * n) != s->crc[at / per])
            return mt_err_set(err, MT_ECORRUPT,
                              "checkpoint '%s' is corrupt: the checksum of tensor '%s' in "
                              "'%s' (bytes %" PRIu64 "..%" PRIu64 ") does not match (a damaged "
                              "file). Load an older checkpoint (set checkpoint%%load to its "
                              "iter_* directory) or start without load",
                              ix->dir, T->name, ix->files[s->file], off,
                              off + 4 * (uint64_t)n);
        *copied += copy_overlap(s, s->lo + at, s->lo + at + n, buf, t);
    }
    return MT_OK;
}

int mt_shard_read(struct mt_shard_index *ix, const struct mt_shard_piece *t, int n,
                  struct mt_err *err)
{
    /* one block, or the largest slice when all are smaller */
    size_t bufbytes = sizeof(float);
    for (int i = 0; i < ix->nt; i++)
        for (int j = 0; j < ix->t[i].n; j++)
            if (sizeof(float) * (ix->t[i].s[j].hi - ix->t[i].s[j].lo) > bufbytes)
                bufbytes = sizeof(float) * (ix->t[i].s[j].hi - ix->t[i].s[j].lo);
    if (bufbytes > ix->block) bufbytes = ix->block;
    float *buf = mt_shard_malloc(bufbytes);
    if (!buf) return mt_err_set(err, MT_ENOMEM, "checkpoint: no memory for a read buffer");
    int rc = MT_OK;
    for (int i = 0; rc == MT_OK && i < n; i++) {
        const struct tensor *T = find(ix, t[i].name);
        if (!T) {
            rc = mt_err_set(err, MT_EINVAL, "checkpoint '%s' has no tensor '%s'", ix->dir,
                            t[i].name);
            break;
        }
        size_t copied = 0;
        for (int j = 0; rc == MT_OK && j < T->n; j++) {
            const struct slice *s = &T->s[j];
            /* the first and last elements of s inside t's box */
            long long lo[4], hi[4];
            bool meets = true;
            for (int d = 0; meets && d < t[i].ndim; d++) {
                lo[d] = s->start[d] > t[i].start[d] ? s->start[d] : t[i].start[d];
                long long b0 = s->start[d] + s->shape[d], b1 = t[i].start[d] + t[i].shape[d];
                hi[d] = (b0 < b1 ? b0 : b1) - 1;
                meets = lo[d] <= hi[d];
            }
            if (!meets) continue;
            size_t f0 = flat(s->start, s->shape, t[i].ndim, lo);
            size_t f1 = flat(s->start, s->shape, t[i].ndim, hi) + 1;
            if (f0 < s->lo) f0 = s->lo;
            if (f1 > s->hi) f1 = s->hi;
            if (f0 >= f1) continue;
            rc = read_slice(ix, T, s, f0, f1, &t[i], buf, &copied, err);
        }
        if (rc == MT_OK && copied != t[i].hi - t[i].lo)
            rc = mt_err_set(err, MT_ECORRUPT,
                            "checkpoint '%s' is corrupt: its slices of tensor '%s' hold %zu of "
                            "the %zu values needed here (slices %s). Load an older checkpoint "
                            "(set checkpoint%%load to its iter_* directory) or start without "
                            "load",
                            ix->dir, t[i].name, copied, t[i].hi - t[i].lo,
                            copied < t[i].hi - t[i].lo ? "missing" : "overlap");
    }
    mt_shard_free(buf, bufbytes);
    return rc;
}

/* ---- indexes built by hand: a Hugging Face directory, upcycling ---------------------- */

int mt_shard_index_new(const char *dir, struct mt_shard_index **out, struct mt_err *err)
{
    struct mt_shard_index *ix = calloc(1, sizeof *ix);
    if (!ix) return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    snprintf(ix->dir, sizeof ix->dir, "%s", dir);
    snprintf(ix->layout, sizeof ix->layout, "Hugging Face safetensors");
    ix->block = mt_shard_block_bytes();
    *out = ix;
    return MT_OK;
}

/* The tensor named name, searched linearly (an index being built is not sorted);
 * NULL when it has none. */
static struct tensor *find_unsorted(const struct mt_shard_index *ix, const char *name)
{
    for (int i = ix->nt; i-- > 0;)
        if (!strcmp(ix->t[i].name, name)) return &ix->t[i];
    return NULL;
}

static int add_tensor(struct mt_shard_index *ix, const char *name, int ndim,
                      const long long *shape, struct tensor **out)
{
    if (ix->nt == ix->tcap) {
        struct tensor *g = realloc(ix->t, (size_t)(ix->tcap + 64) * sizeof *g);
        if (!g) return MT_ENOMEM;
        ix->t = g;
        ix->tcap += 64;
    }
    struct tensor *t = &ix->t[ix->nt];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return MT_ENOMEM;
    t->ndim = ndim;
    for (int d = 0; d < 4; d++) t->shape[d] = d < ndim ? shape[d] : 0;
    ix->nt++;
    *out = t;
    return MT_OK;
}

int mt_shard_index_add(struct mt_shard_index *ix, const char *name, int ndim,
                       const long long *shape, const long long *start,
                       const long long *slice_shape, const char *file, uint64_t offset,
                       enum mt_shard_dtype dtype, struct mt_err *err)
{
    struct tensor *t = find_unsorted(ix, name);
    if (!t && add_tensor(ix, name, ndim, shape, &t))
        return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    struct slice s = { .offset = offset, .dtype = dtype };
    for (int d = 0; d < ndim; d++) {
        s.start[d] = start[d];
        s.shape[d] = slice_shape[d];
    }
    s.hi = box_numel(ndim, s.shape);
    if (file_id(ix, file, &s.file) || add_slice(t, &s))
        return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    return MT_OK;
}

int mt_shard_index_replicate(struct mt_shard_index *ix, const char *from, const char *to,
                             long long copies, struct mt_err *err)
{
    struct tensor *f = find_unsorted(ix, from);
    if (!f) return mt_err_set(err, MT_EINVAL, "checkpoint '%s' has no tensor '%s'", ix->dir, from);
    if (f->ndim > 3)
        return mt_err_set(err, MT_EINVAL, "checkpoint '%s': tensor '%s' has %d dimensions",
                          ix->dir, from, f->ndim);
    long long shape[4] = {copies, f->shape[0], f->shape[1], f->shape[2]};
    const int fi = (int)(f - ix->t);
    struct tensor *t;
    if (add_tensor(ix, to, f->ndim + 1, shape, &t))
        return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    f = &ix->t[fi]; /* add_tensor may have moved the array */
    for (long long c = 0; c < copies; c++)
        for (int j = 0; j < f->n; j++) {
            struct slice s = f->s[j];
            for (int d = f->ndim; d > 0; d--) {
                s.start[d] = s.start[d - 1];
                s.shape[d] = s.shape[d - 1];
            }
            s.start[0] = c;
            s.shape[0] = 1;
            if (f->s[j].crc) {
                s.crc = malloc(sizeof(uint32_t) * (s.ncrc ? s.ncrc : 1));
                if (!s.crc) return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
                memcpy(s.crc, f->s[j].crc, sizeof(uint32_t) * s.ncrc);
            }
            if (add_slice(t, &s)) {
                free(s.crc);
                return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
            }
        }
    /* the source is consumed: removed from the index (and its parameter table) */
    for (int i = 0; i < ix->nparams_t; i++)
        if (ix->pnames[i] == f->name) {
            for (int k = i + 1; k < ix->nparams_t; k++) {
                ix->pnames[k - 1] = ix->pnames[k];
                ix->pndims[k - 1] = ix->pndims[k];
                memcpy(ix->pshapes[k - 1], ix->pshapes[k], sizeof ix->pshapes[k]);
            }
            ix->nparams_t--;
            break;
        }
    for (int j = 0; j < f->n; j++) free(f->s[j].crc);
    free(f->s);
    free(f->name);
    memmove(f, f + 1, (size_t)(ix->nt - fi - 1) * sizeof *f);
    ix->nt--;
    return MT_OK;
}

int mt_shard_index_seal(struct mt_shard_index *ix, struct mt_err *err)
{
    qsort(ix->t, (size_t)ix->nt, sizeof *ix->t, cmp_tensor);
    for (int i = 1; i < ix->nt; i++)
        if (!strcmp(ix->t[i].name, ix->t[i - 1].name))
            return mt_err_set(err, MT_EINVAL, "checkpoint '%s' holds tensor '%s' twice", ix->dir,
                              ix->t[i].name);
    free(ix->fds);
    ix->fds = malloc(sizeof(int) * (size_t)(ix->nfiles ? ix->nfiles : 1));
    if (!ix->fds) return mt_err_set(err, MT_ENOMEM, "checkpoint: out of memory");
    for (int i = 0; i < ix->nfiles; i++) ix->fds[i] = -1;
    return MT_OK;
}

int mt_shard_index_count(const struct mt_shard_index *ix) { return ix->nt; }

const char *mt_shard_index_tensor(const struct mt_shard_index *ix, int i, int *ndim,
                                  long long shape[4])
{
    if (ndim) *ndim = ix->t[i].ndim;
    if (shape) memcpy(shape, ix->t[i].shape, sizeof ix->t[i].shape);
    return ix->t[i].name;
}

int mt_shard_index_find(const struct mt_shard_index *ix, const char *name)
{
    const struct tensor *t = find(ix, name);
    return t ? (int)(t - ix->t) : -1;
}

void mt_shard_dims_text(int ndim, const long long *shape, char *out, size_t len)
{
    size_t at = (size_t)snprintf(out, len, "[");
    for (int d = 0; d < ndim && at < len; d++)
        at += (size_t)snprintf(out + at, len - at, "%s%lld", d ? ", " : "", shape[d]);
    if (at < len) snprintf(out + at, len - at, "]");
}
