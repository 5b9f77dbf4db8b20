/* moetrain: host memory between steps — the per-step host counters and manual GC.
 *
 * Counters. A step's host cost is read from the kernel and the C library at its
 * boundaries: CPU time (getrusage user + system, every thread of the process), minor
 * page faults (ru_minflt) and, when the allocation-counting library is preloaded
 * (tests/util/alloc_count.c, LD_PRELOAD), heap allocations, apart those the MPI
 * library and the OpenMP runtime made. Without that library allocations are not counted, and the log says so.
 *
 * Manual GC. C has no garbage collector, but freed host memory goes back to the system
 * whenever the C library decides (glibc trims the heap top past M_TRIM_THRESHOLD and
 * unmaps large blocks on free), and caches kept by the process (the CPU backend's
 * scratch pool) only grow. With manual GC the automatic release is switched off
 * (mt_hostmem_hold) and memory is released only by mt_hostmem_collect, which the
 * trainer calls at steps chosen by a rule on the step number, the same on every rank.
 * Caches register a mark and a release function: mark records what the cache holds
 * now as its high-water mark, release frees what it grew beyond its mark. */
#ifndef MT_UTIL_HOSTMEM_H
#define MT_UTIL_HOSTMEM_H

#include <stdbool.h>
#include <stddef.h>

/* The process's host counters at one moment. */
struct mt_host_sample {
    double cpu_s;          /* user + system CPU time, every thread */
    long long minflt;      /* minor page faults */
    long long allocs;      /* heap allocations (0 when not counted) */
    long long allocs_mpi;  /* of those, made by the MPI library */
    long long allocs_omp;  /* of those, made by the OpenMP runtime */
    long long allocs_blas; /* of those, made by the BLAS library */
};

/* Reads the counters now. */
void mt_host_sample(struct mt_host_sample *s);
/* Whether allocations are counted (the counting library is preloaded). */
bool mt_host_allocs_counted(void);

/* A cache of host memory that manual GC can shrink. */
struct mt_host_cache {
    const char *name;
    void (*mark)(void);      /* what it holds now is its high-water mark */
    size_t (*release)(void); /* frees what it holds beyond its mark; returns the bytes */
};
/* Registers c (kept by pointer: static storage) once; later calls with the same c do
 * nothing. At most a few caches (8). */
void mt_hostmem_add_cache(const struct mt_host_cache *c);

/* Switches the C library's automatic release off for the rest of the process: freed
 * memory stays in the heap until mt_hostmem_collect. And pages in a reserve of heap
 * (MT_HOSTMEM_RESERVE bytes, freed again, so the heap keeps it) for what libraries
 * allocate during the steps (the MPI library builds and frees a schedule per
 * collective): their allocations then take no page faults. Collections keep it. */
#define MT_HOSTMEM_RESERVE ((size_t)8 << 20)
void mt_hostmem_hold(void);

/* What one collection found and released. */
struct mt_gc_report {
    size_t heap_before, heap_after;  /* bytes the heap holds from the system (mallinfo2
                                        arena + hblkhd) */
    size_t free_before, free_after;  /* of those, free (mallinfo2 fordblks) */
    size_t caches_released;          /* bytes the caches' release functions freed */
};
/* The two kinds of collection. */
enum mt_gc_kind {
    /* every cache marks what it holds; then malloc_trim gives the heap's free pages back
     * to the system (after mt_hostmem_hold: all but the reserve at the heap's top, which
     * is paged in again where a library used part of it) */
    MT_GC_FULL,
    /* every cache frees what it grew beyond its mark, then marks; the heap is not trimmed
     * (what was freed stays for the next steps; the next full collection trims it) */
    MT_GC_GROWTH,
};
void mt_hostmem_collect(enum mt_gc_kind kind, struct mt_gc_report *r);

/* Touches every page of [p, p + n) (writes a zero), so that using it later takes no
 * page fault. */
void mt_hostmem_prefault(void *p, size_t n);

#endif
