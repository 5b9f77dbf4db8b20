/* moetrain: shared libraries loaded at run time.
 *
 * The CUDA toolkit libraries (cuBLASLt, NCCL) and the NVIDIA driver are opened only
 * when a GPU run needs them, so that the CPU paths (--version, --check, topo, the CPU
 * backend) run on nodes that have none of them (doc/site-install.md). A library is
 * looked for by its soname through the dynamic linker (LD_LIBRARY_PATH, the ld.so
 * cache: what a site's CUDA module sets up), then in the directories configure found
 * it in. */
#ifndef MT_UTIL_DYNLIB_H
#define MT_UTIL_DYNLIB_H

#include <stddef.h>

struct mt_err;

/* One function the caller needs: its name, and its address once loaded. */
struct mt_dynlib_sym {
    const char *name;
    void *addr;
};

/* Opens soname (what: a few words naming it, e.g. "cuBLASLt, CUDA 13.1"), trying the
 * dynamic linker's search first and then each directory of dirs (a ':'-separated list,
 * may be empty), and resolves every symbol of syms (nsyms of them). The library stays
 * loaded. On failure: MT_EUNSUPPORTED and a message naming the library, every place
 * looked at, and fix (what makes it found). */
int mt_dynlib_load(const char *soname, const char *what, const char *dirs, const char *fix,
                   struct mt_dynlib_sym *syms, size_t nsyms, struct mt_err *err);

#endif
