#include "util/hostmem.h"

#include <dlfcn.h>
#include <malloc.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* The counting library's record (tests/util/alloc_count.c). */
struct mt_alloccount {
    long long allocs, allocs_mpi, allocs_omp, allocs_blas, frees;
};
typedef void (*read_fn)(struct mt_alloccount *);

static read_fn counter;
static pthread_once_t counter_once = PTHREAD_ONCE_INIT;

static void find_counter(void)
{
    *(void **)&counter = dlsym(RTLD_DEFAULT, "mt_alloccount_read");
}

bool mt_host_allocs_counted(void)
{
    pthread_once(&counter_once, find_counter);
    return counter != NULL;
}

void mt_host_sample(struct mt_host_sample *s)
{
    struct rusage ru;
    memset(s, 0, sizeof *s);
    if (getrusage(RUSAGE_SELF, &ru) == 0) {
        s->cpu_s = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
                   (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
        s->minflt = ru.ru_minflt;
    }
    if (mt_host_allocs_counted()) {
        struct mt_alloccount c;
        counter(&c);
        s->allocs = c.allocs;
        s->allocs_mpi = c.allocs_mpi;
        s->allocs_omp = c.allocs_omp;
        s->allocs_blas = c.allocs_blas;
    }
}

#define MAX_CACHES 8
static const struct mt_host_cache *caches[MAX_CACHES];
static int ncaches;
static pthread_mutex_t caches_lock = PTHREAD_MUTEX_INITIALIZER;

void mt_hostmem_add_cache(const struct mt_host_cache *c)
{
    pthread_mutex_lock(&caches_lock);
    bool known = false;
    for (int i = 0; i < ncaches; i++) known = known || caches[i] == c;
    if (!known && ncaches < MAX_CACHES) caches[ncaches++] = c;
    pthread_mutex_unlock(&caches_lock);
}

/* Touches MT_HOSTMEM_RESERVE bytes of heap and frees them: with trimming off they stay
 * in the heap, paged in, for what the libraries allocate during the steps. */
static void touch_reserve(void)
{
    char *p = malloc(MT_HOSTMEM_RESERVE);
    if (!p) return; /* only a cost: the libraries' allocations may then fault */
    mt_hostmem_prefault(p, MT_HOSTMEM_RESERVE);
    free(p);
}

static bool holding;

void mt_hostmem_hold(void)
{
    /* no trimming of the heap top on free, and a fixed mmap threshold (at glibc's
     * largest, 32 MiB on 64-bit): blocks below it come from the heap and stay there
     * when freed, and the threshold no longer moves with what was freed */
    mallopt(M_TRIM_THRESHOLD, 0x7fffffff);
    mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
    holding = true;
    touch_reserve();
}

static void heap_now(size_t *held, size_t *free_bytes)
{
    struct mallinfo2 mi = mallinfo2();
    *held = mi.arena + mi.hblkhd;
    *free_bytes = mi.fordblks;
}

void mt_hostmem_collect(enum mt_gc_kind kind, struct mt_gc_report *r)
{
    memset(r, 0, sizeof *r);
    heap_now(&r->heap_before, &r->free_before);
    pthread_mutex_lock(&caches_lock);
    for (int i = 0; i < ncaches; i++) {
        if (kind == MT_GC_GROWTH) r->caches_released += caches[i]->release();
        caches[i]->mark();
    }
    pthread_mutex_unlock(&caches_lock);
    if (kind == MT_GC_FULL)
        malloc_trim(holding ? MT_HOSTMEM_RESERVE : 0); /* the reserve stays at the heap top */
    heap_now(&r->heap_after, &r->free_after);
    if (kind == MT_GC_FULL && holding) touch_reserve();
}

void mt_hostmem_prefault(void *p, size_t n)
{
    static size_t page;
    if (!page) page = (size_t)sysconf(_SC_PAGESIZE);
    volatile char *c = p;
    for (size_t i = 0; i < n; i += page) c[i] = 0;
    if (n) c[n - 1] = 0;
}
