/* The allocation-counting library: LD_PRELOAD it and every heap allocation of the
 * process (malloc, calloc, realloc, reallocarray, posix_memalign, aligned_alloc, memalign,
 * valloc, pvalloc) and every free is counted, the allocations also by who called: the code of
 * the MPI library (Open MPI's libraries, its plugins and its transports), the OpenMP
 * runtime (libgomp: a parallel region of one thread allocates its team at every call)
 * or anything else. moetrain finds mt_alloccount_read (dlsym) and logs the counts per step
 * (doc/host-overhead.md); tests and bench/host_jitter.sh read them from its log.
 *
 * The caller is the return address of the allocation call, looked up with dladdr
 * (cached): an allocation that a C library function makes for its caller (strdup,
 * fopen, qsort) is counted as the C library's, that is, neither the MPI library's nor
 * the OpenMP runtime's.
 *
 * MT_ALLOCCOUNT_TRACE=N: from the N-th call of mt_alloccount_read on, every allocation
 * prints its call stack to stderr (finding the allocation that a step makes).
 *
 * Calls glibc's own entry points (__libc_malloc, ...), so it needs glibc. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <malloc.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

/* What moetrain reads (mirrored in src/util/hostmem.c). */
struct mt_alloccount {
    long long allocs;      /* allocations, every caller */
    long long allocs_mpi;  /* of those, made by the MPI library */
    long long allocs_omp;  /* of those, made by the OpenMP runtime */
    long long allocs_blas; /* of those, made by the BLAS library */
    long long frees;       /* frees of a non-NULL pointer */
};

static atomic_llong n_allocs, n_allocs_mpi, n_allocs_omp, n_allocs_blas, n_frees, n_reads;
static long long trace_from = -1;
static _Thread_local int busy; /* inside our own bookkeeping: count, do not classify */

enum caller { OTHER, MPI, OMP, BLAS };

static bool is_omp_object(const char *path) { return strstr(path, "libgomp") || strstr(path, "libomp"); }

/* The BLAS libraries configure can link (OpenBLAS's small-matrix kernels for AVX-512
 * Intel CPUs allocate a buffer at every call, others not at all). */
static bool is_blas_object(const char *path)
{
    return strstr(path, "libopenblas") || strstr(path, "libblis") || strstr(path, "libmkl") ||
           strstr(path, "libblas") || strstr(path, "libcblas");
}

/* Open MPI's objects: its libraries, its plugins (mca_*), PMIx and the transports it
 * loads. */
static bool is_mpi_object(const char *path)
{
    static const char *const names[] = {
        "libmpi", "libopen-pal", "libopen-rte", "libpmix", "libprrte", "/mca_", "libucp",
        "libucs", "libuct", "libucm", "libfabric", "libpsm", "libibverbs", "libevent",
        "libhwloc", "openmpi/", "pmix/",
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strstr(path, names[i])) return true;
    return false;
}

/* Direct-mapped cache of return address -> class: (address << 3) | 4 | class (class < 4). */
#define CACHE 4096
static atomic_ullong cache[CACHE];

static enum caller caller_of(void *ret)
{
    uintptr_t a = (uintptr_t)ret;
    size_t slot = (a >> 2) % CACHE;
    unsigned long long e = atomic_load_explicit(&cache[slot], memory_order_relaxed);
    if ((e >> 3) == (unsigned long long)a && (e & 4)) return (enum caller)(e & 3);
    Dl_info info;
    enum caller c = OTHER;
    busy++;
    if (dladdr(ret, &info) && info.dli_fname)
        c = is_mpi_object(info.dli_fname)    ? MPI
            : is_omp_object(info.dli_fname)  ? OMP
            : is_blas_object(info.dli_fname) ? BLAS
                                             : OTHER;
    busy--;
    atomic_store_explicit(&cache[slot], ((unsigned long long)a << 3) | 4 | (unsigned)c,
                          memory_order_relaxed);
    return c;
}

static void trace(void)
{
    void *frames[32];
    busy++;
    int n = backtrace(frames, 32);
    static const char head[] = "mt_alloccount: allocation at\n";
    if (write(2, head, sizeof head - 1) < 0) { /* nothing to do */ }
    backtrace_symbols_fd(frames + 1, n - 1, 2);
    busy--;
}

static void counted(void *ret)
{
    atomic_fetch_add_explicit(&n_allocs, 1, memory_order_relaxed);
    if (busy) return;
    enum caller c = caller_of(ret);
    if (c == MPI) atomic_fetch_add_explicit(&n_allocs_mpi, 1, memory_order_relaxed);
    if (c == OMP) atomic_fetch_add_explicit(&n_allocs_omp, 1, memory_order_relaxed);
    if (c == BLAS) atomic_fetch_add_explicit(&n_allocs_blas, 1, memory_order_relaxed);
    if (trace_from >= 0 && atomic_load_explicit(&n_reads, memory_order_relaxed) >= trace_from)
        trace();
}

__attribute__((constructor)) static void init(void)
{
    const char *t = getenv("MT_ALLOCCOUNT_TRACE");
    if (t && *t) {
        void *frames[2];
        busy++;
        backtrace(frames, 2); /* loads the unwinder now, not inside a traced call */
        busy--;
        trace_from = atoll(t);
    }
}

void mt_alloccount_read(struct mt_alloccount *c)
{
    c->allocs = atomic_load(&n_allocs);
    c->allocs_mpi = atomic_load(&n_allocs_mpi);
    c->allocs_omp = atomic_load(&n_allocs_omp);
    c->allocs_blas = atomic_load(&n_allocs_blas);
    c->frees = atomic_load(&n_frees);
    atomic_fetch_add(&n_reads, 1);
}

void *malloc(size_t n)
{
    counted(__builtin_return_address(0));
    return __libc_malloc(n);
}

void *calloc(size_t m, size_t n)
{
    counted(__builtin_return_address(0));
    return __libc_calloc(m, n);
}

void *realloc(void *p, size_t n)
{
    if (n) counted(__builtin_return_address(0));
    if (p && !n) atomic_fetch_add_explicit(&n_frees, 1, memory_order_relaxed);
    return __libc_realloc(p, n);
}

void free(void *p)
{
    if (p) atomic_fetch_add_explicit(&n_frees, 1, memory_order_relaxed);
    __libc_free(p);
}

void *reallocarray(void *p, size_t m, size_t n)
{
    size_t bytes;
    if (__builtin_mul_overflow(m, n, &bytes)) {
        errno = ENOMEM;
        return NULL;
    }
    if (bytes) counted(__builtin_return_address(0));
    if (p && !bytes) atomic_fetch_add_explicit(&n_frees, 1, memory_order_relaxed);
    return __libc_realloc(p, bytes);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    if (align < sizeof(void *) || (align & (align - 1))) return EINVAL;
    counted(__builtin_return_address(0));
    void *p = __libc_memalign(align, n);
    if (!p) return ENOMEM;
    *out = p;
    return 0;
}

void *aligned_alloc(size_t align, size_t n)
{
    counted(__builtin_return_address(0));
    return __libc_memalign(align, n);
}

void *memalign(size_t align, size_t n)
{
    counted(__builtin_return_address(0));
    return __libc_memalign(align, n);
}

void *valloc(size_t n)
{
    counted(__builtin_return_address(0));
    return __libc_memalign((size_t)sysconf(_SC_PAGESIZE), n);
}

void *pvalloc(size_t n)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    counted(__builtin_return_address(0));
    return __libc_memalign(page, (n + page - 1) / page * page);
}
