// The CUDA execution emulator: the runtime API kernels/cuda calls, on one emulated
// device (an H100 by default; MT_EMU_DEVICE=gb200 for a GB200, MT_EMU_DEVICE_COUNT=0
// for a machine without one).
//
// Device memory: every cudaMalloc is its own mapping, the allocation (rounded up to
// 256 bytes, CUDA's alignment) ending at the last byte before an inaccessible page and
// starting after another, so reads and writes past either end fault at once; the
// fault handler names the allocation and the emulated thread. Fresh memory is filled
// with 0xff bytes (NaN as float or double, -1 as an integer) so that a read of
// memory nobody wrote shows. cudaFree makes the range inaccessible (use after free
// faults) and keeps it reserved for a while. Copies and memsets are checked against
// the exact size requested of cudaMalloc.
//
// Copies and memsets are device work on a stream (emu_streams.cc).
#include "kernels/cuda/emu/emu_internal.h"
#include "kernels/cuda/emu/emu_streams.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif
#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

namespace mt_emu {

// ---------------------------------------------------------------- the device

struct device_model {
    const char *key, *name;
    int major, minor, sms, smem_optin;
    double mem_gib;
    int clock_khz;
};
static const device_model models[] = {
    {"h100", "NVIDIA H100 80GB HBM3 (moetrain CUDA emulator)", 9, 0, 132, 232448, 80.0, 1980000},
    {"gb200", "NVIDIA GB200 (moetrain CUDA emulator)", 10, 0, 148, 232448, 186.0, 1965000},
};

static const device_model &device()
{
    static const device_model *m = [] {
        const char *e = getenv("MT_EMU_DEVICE");
        for (const device_model &d : models)
            if (!e || !*e || !strcmp(e, d.key)) return &d;
        fprintf(stderr, "moetrain CUDA emulator: MT_EMU_DEVICE='%s' is not h100 or gb200; using h100\n", e);
        return &models[0];
    }();
    return *m;
}

static int device_count()
{
    const char *e = getenv("MT_EMU_DEVICE_COUNT");
    return e && *e ? atoi(e) : 1;
}

int device_smem_optin(void) { return device().smem_optin; }

static thread_local cudaError_t last_error = cudaSuccess;
void set_last_error(cudaError_t e) { last_error = e; }
static cudaError_t ret(cudaError_t e)
{
    if (e != cudaSuccess) last_error = e;
    return e;
}

// ---------------------------------------------------------------- memory table

struct region {
    unsigned char *map; // mapping: guard page, pages, guard page
    size_t map_len;
    size_t requested, rounded; // requested: the extent in use (note_extent), checked
    bool freed;
    bool host;     // cudaMallocHost
    size_t capacity; // the size given to cudaMalloc
    bool cached;     // held free by kernels/cuda's caching allocator (note_extent 0)
};

// Under AddressSanitizer the bytes past the extent in use (to the 256-byte rounding, or
// to the allocator's size class) are poisoned, so a kernel reading them is reported
// even where no guard page can be.
static void poison_tail(unsigned char *p, size_t extent, size_t rounded)
{
#if defined(__SANITIZE_ADDRESS__)
    ASAN_POISON_MEMORY_REGION(p, rounded);
    ASAN_UNPOISON_MEMORY_REGION(p, extent);
#else
    (void)p, (void)extent, (void)rounded;
#endif
}

static std::mutex mem_mu;
static std::map<uintptr_t, region> regions; // user pointer -> region
static std::deque<uintptr_t> quarantine;     // freed regions, oldest first
static size_t quarantined_bytes;
static std::map<uintptr_t, size_t> stack_guards;
static const size_t page = 4096;

void note_stack_guard(const void *p, size_t bytes)
{
    std::lock_guard<std::mutex> lock(mem_mu);
    stack_guards[(uintptr_t)p] = bytes;
}

// The region whose mapping contains a, or null.
static const std::pair<const uintptr_t, region> *region_of(uintptr_t a)
{
    auto it = regions.upper_bound(a + 2 * page + 256);
    while (it != regions.begin()) {
        --it;
        const region &r = it->second;
        if (a >= (uintptr_t)r.map && a < (uintptr_t)r.map + r.map_len) return &*it;
        if ((uintptr_t)r.map + r.map_len + (64u << 20) < a) break;
    }
    return nullptr;
}

// The source line of a faulting instruction: a signal carries only the address, so
// addr2line (binutils) reads the debug information of the object that holds it. Prints
// nothing when that fails (no addr2line, no -g).
static void print_source_line(FILE *f, const void *pc)
{
    Dl_info info;
    if (!pc || !dladdr(pc, &info) || !info.dli_fname) return;
    struct main_base {
        static int first(struct dl_phdr_info *i, size_t, void *out)
        {
            *static_cast<uintptr_t *>(out) = i->dlpi_addr;
            return 1; // the first object is the program
        }
    };
    uintptr_t program = 0;
    dl_iterate_phdr(&main_base::first, &program);
    const bool in_program = (uintptr_t)info.dli_fbase == program || !*info.dli_fname;
    char file[4096];
    if (in_program) {
        const ssize_t n = readlink("/proc/self/exe", file, sizeof file - 1);
        if (n <= 0) return;
        file[n] = 0;
    } else {
        snprintf(file, sizeof file, "%s", info.dli_fname);
    }
    char off[32];
    snprintf(off, sizeof off, "0x%lx", (unsigned long)((uintptr_t)pc - (uintptr_t)info.dli_fbase));
    fprintf(f, "  faulting instruction: ");
    fflush(f);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fileno(f), 1);
        execlp("addr2line", "addr2line", "-f", "-C", "-i", "-p", "-e", file, off, (char *)nullptr);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fprintf(f, "%s+%s (addr2line could not name it)\n", file, off);
}

static void fault_handler(int sig, siginfo_t *si, void *uc)
{
    const uintptr_t a = (uintptr_t)si->si_addr;
    char msg[512] = "";
    const auto *rp = region_of(a);
    if (rp) {
        const uintptr_t p = rp->first;
        const region &r = rp->second;
        if (r.freed)
            snprintf(msg, sizeof msg, "access to %p: %zd bytes into a %zu-byte device allocation at 0x%lx that was freed",
                     (void *)a, (ssize_t)(a - p), r.requested, (unsigned long)p);
        else if (a >= p)
            snprintf(msg, sizeof msg, "access to %p: %zu bytes past the end of a %zu-byte device allocation at 0x%lx",
                     (void *)a, (size_t)(a - p - r.requested), r.requested, (unsigned long)p);
        else
            snprintf(msg, sizeof msg, "access to %p: %zu bytes before the start of a %zu-byte device allocation at 0x%lx",
                     (void *)a, (size_t)(p - a), r.requested, (unsigned long)p);
    } else {
        for (const auto &g : stack_guards)
            if (a >= g.first && a < g.first + g.second)
                snprintf(msg, sizeof msg,
                         "stack overflow of an emulated thread (raise MT_EMU_STACK_KB, now %s)",
                         getenv("MT_EMU_STACK_KB") ? getenv("MT_EMU_STACK_KB") : "256");
    }
    if (!*msg) { // not the emulator's: the ordinary crash
        signal(sig, SIG_DFL);
        return;
    }
    fflush(stdout);
    fprintf(stderr, "moetrain CUDA emulator: error: invalid memory access (%s)\n  %s\n",
            sig == SIGSEGV ? "SIGSEGV" : "SIGBUS", msg);
    print_source_line(stderr, (const void *)static_cast<ucontext_t *>(uc)->uc_mcontext.gregs[REG_RIP]);
    describe_fault_context(stderr);
    fprintf(stderr, "HINT: run under gdb to stop at the faulting load or store; doc/cuda-emulator.md\n");
    fflush(stderr);
    signal(SIGABRT, SIG_DFL);
    abort();
}

static void install_fault_handler()
{
    static std::once_flag once;
    std::call_once(once, [] {
        static char altstack[64 << 10];
        stack_t ss = {};
        ss.ss_sp = altstack;
        ss.ss_size = sizeof altstack;
        sigaltstack(&ss, nullptr);
        struct sigaction sa = {};
        sa.sa_sigaction = fault_handler;
        sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
        sigaction(SIGSEGV, &sa, nullptr);
        sigaction(SIGBUS, &sa, nullptr);
    });
}

static void *map_region(size_t bytes, bool host)
{
    install_fault_handler();
    const size_t rounded = (bytes + 255) / 256 * 256;
    const size_t pages = (rounded + page - 1) / page * page;
    unsigned char *m = static_cast<unsigned char *>(
        mmap(nullptr, pages + 2 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
    if (m == MAP_FAILED) return nullptr;
    if (mprotect(m + page, pages, PROT_READ | PROT_WRITE) != 0) {
        munmap(m, pages + 2 * page);
        return nullptr;
    }
    unsigned char *p = m + page + pages - rounded;
    memset(p, 0xff, rounded);
    std::lock_guard<std::mutex> lock(mem_mu);
    regions[(uintptr_t)p] = region{m, pages + 2 * page, bytes, rounded, false, host, bytes, false};
    poison_tail(p, bytes, rounded);
    return p;
}

static cudaError_t unmap_region(void *p, bool host, const char *what)
{
    std::lock_guard<std::mutex> lock(mem_mu);
    auto it = regions.find((uintptr_t)p);
    if (it == regions.end() || it->second.freed || it->second.host != host) {
        fprintf(stderr, "moetrain CUDA emulator: %s(%p): %s\n", what, p,
                it == regions.end() ? "not a pointer this allocator returned"
                : it->second.freed  ? "freed already"
                                    : "memory of the other kind (cudaFree/cudaFreeHost mixed up)");
        return cudaErrorInvalidValue;
    }
    region &r = it->second;
    r.freed = true;
#if defined(__SANITIZE_ADDRESS__)
    ASAN_UNPOISON_MEMORY_REGION((void *)it->first, r.rounded); // the range may be mapped again later
#endif
    madvise(r.map, r.map_len, MADV_DONTNEED);
    mprotect(r.map, r.map_len, PROT_NONE);
    quarantine.push_back(it->first);
    quarantined_bytes += r.map_len;
    while (quarantined_bytes > (4ull << 30)) { // keep 4 GiB of freed ranges faulting
        auto old = regions.find(quarantine.front());
        quarantine.pop_front();
        quarantined_bytes -= old->second.map_len;
        munmap(old->second.map, old->second.map_len);
        regions.erase(old);
    }
    return cudaSuccess;
}

// The live allocation holding [p, p + n): its kind; an error message when p is in an
// allocation but the range leaves it, or the allocation was freed.
enum mem_kind { MEM_UNREGISTERED, MEM_HOST, MEM_DEVICE, MEM_BAD };
static mem_kind classify(const void *p, size_t n, char *why, size_t why_len)
{
    std::lock_guard<std::mutex> lock(mem_mu);
    const auto *rp = region_of((uintptr_t)p);
    if (!rp) return MEM_UNREGISTERED;
    const region &r = rp->second;
    const uintptr_t a = (uintptr_t)p, base = rp->first;
    if (r.freed) {
        snprintf(why, why_len, "%p is in a %zu-byte allocation that was freed", p, r.requested);
        return MEM_BAD;
    }
    if (r.cached) {
        snprintf(why, why_len, "%p is in a %zu-byte block that the caching allocator holds free (used after free)",
                 p, r.capacity);
        return MEM_BAD;
    }
    if (a < base || a + n > base + r.requested) {
        snprintf(why, why_len, "%zu bytes at %p leave the %zu-byte allocation at %p (offset %td)", n, p, r.requested,
                 (void *)base, (ptrdiff_t)(a - base));
        return MEM_BAD;
    }
    return r.host ? MEM_HOST : MEM_DEVICE;
}

// The host's view (what copies are checked against) changes at once; the poisoning in
// stream order, after the work queued before it, which may still use the old extent.
static void set_extent(const void *p, size_t bytes, bool cached, cudaStream_t stream)
{
    std::unique_lock<std::mutex> lock(mem_mu);
    auto it = regions.find((uintptr_t)p);
    if (it == regions.end() || it->second.freed || it->second.host)
        fail(nullptr, 0, "the caching allocator hands out %p, which is not a live cudaMalloc allocation", p);
    region &r = it->second;
    if (bytes > r.capacity)
        fail(nullptr, 0, "the caching allocator hands out %zu bytes of the %zu-byte block at %p", bytes, r.capacity, p);
    r.cached = cached;
    r.requested = bytes;
    unsigned char *b = static_cast<unsigned char *>(const_cast<void *>(p));
    const size_t rounded = r.rounded;
    lock.unlock();
    // inside a capture the allocator's bookkeeping is the host's, not the graph's: the
    // tail is not poisoned there
    if (capturing(stream)) return;
    stream_work(stream, cached ? "the caching allocator's free" : "the caching allocator's allocation", nullptr, 0,
                nullptr, 0, [b, bytes, rounded] { poison_tail(b, bytes, rounded); });
}

void note_extent(const void *p, size_t bytes, cudaStream_t stream) { set_extent(p, bytes, false, stream); }
void note_cached(const void *p, cudaStream_t stream) { set_extent(p, 0, true, stream); }

bool live_allocation(const void *p, uintptr_t *base, size_t *bytes)
{
    std::lock_guard<std::mutex> lock(mem_mu);
    const auto *rp = region_of((uintptr_t)p);
    if (!rp || rp->second.freed || (uintptr_t)p < rp->first || (uintptr_t)p >= rp->first + rp->second.rounded)
        return false;
    *base = rp->first;
    *bytes = rp->second.requested;
    return true;
}

static cudaError_t check_range(const char *api, const void *p, size_t n, bool must_be_device)
{
    char why[256];
    const mem_kind k = classify(p, n, why, sizeof why);
    if (k == MEM_BAD) fail(nullptr, 0, "%s: %s", api, why);
    if (must_be_device && k != MEM_DEVICE)
        fail(nullptr, 0, "%s: %p is not device memory (not returned by cudaMalloc)", api, p);
    return cudaSuccess;
}

// ---------------------------------------------------------------- kernels' attributes

static std::mutex attr_mu;
static std::map<const void *, size_t> smem_granted;

size_t dynamic_smem_granted(const void *func)
{
    std::lock_guard<std::mutex> lock(attr_mu);
    auto it = smem_granted.find(func);
    return it == smem_granted.end() ? 48u << 10 : it->second;
}

} // namespace mt_emu

using namespace mt_emu;

// ---------------------------------------------------------------- the runtime API

extern "C" {

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate capture sequences";
    case cudaErrorStreamCaptureUnmatched: return "capture was not initiated in this stream";
    case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    default: return "unknown error (emulator)";
    }
}

cudaError_t cudaGetLastError(void)
{
    const cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = device_count();
    return *n > 0 ? cudaSuccess : ret(cudaErrorNoDevice);
}

static int current_device = 0;
cudaError_t cudaSetDevice(int d)
{
    if (d < 0 || d >= device_count()) return ret(cudaErrorInvalidDevice);
    current_device = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d)
{
    if (device_count() < 1) return ret(cudaErrorNoDevice);
    *d = current_device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *v, enum cudaDeviceAttr attr, int dev)
{
    if (dev < 0 || dev >= device_count()) return ret(cudaErrorInvalidDevice);
    const device_model &m = device();
    switch (attr) {
    case cudaDevAttrMultiProcessorCount: *v = m.sms; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = m.smem_optin; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = 48 << 10; break;
    case cudaDevAttrClockRate: *v = m.clock_khz; break;
    case cudaDevAttrMaxThreadsPerBlock: *v = 1024; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrComputeCapabilityMajor: *v = m.major; break;
    case cudaDevAttrComputeCapabilityMinor: *v = m.minor; break;
    default:
        fprintf(stderr, "moetrain CUDA emulator: cudaDeviceGetAttribute(%d) is not emulated\n", (int)attr);
        return ret(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int dev)
{
    if (dev < 0 || dev >= device_count()) return ret(cudaErrorInvalidDevice);
    const device_model &m = device();
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", m.name);
    p->major = m.major;
    p->minor = m.minor;
    p->multiProcessorCount = m.sms;
    p->totalGlobalMem = (size_t)(m.mem_gib * 1024 * 1024 * 1024);
    p->sharedMemPerBlock = 48 << 10;
    p->sharedMemPerBlockOptin = (size_t)m.smem_optin;
    p->maxThreadsPerBlock = 1024;
    p->warpSize = 32;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t n)
{
    *p = nullptr;
    if (cudaError_t e = capture_refuses_unsafe("cudaMalloc")) return e;
    if (n == 0) return cudaSuccess;
    *p = map_region(n, false);
    return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

// Both wait for the whole device first, as CUDA's do.
cudaError_t cudaFree(void *p)
{
    if (!p) return cudaSuccess;
    if (cudaError_t e = capture_refuses_device_wait("cudaFree")) return e;
    note_host_sync();
    host_waits_device();
    forget_allocation(p);
    return ret(unmap_region(p, false, "cudaFree"));
}

cudaError_t cudaMallocHost(void **p, size_t n)
{
    if (cudaError_t e = capture_refuses_unsafe("cudaMallocHost")) {
        *p = nullptr;
        return e;
    }
    *p = map_region(n ? n : 1, true);
    return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void *p)
{
    if (!p) return cudaSuccess;
    if (cudaError_t e = capture_refuses_device_wait("cudaFreeHost")) return e;
    note_host_sync();
    host_waits_device();
    forget_allocation(p);
    return ret(unmap_region(p, true, "cudaFreeHost"));
}

// A copy on a stream. Pageable host memory (not from cudaMallocHost) behaves as CUDA
// documents: a copy from it waits for the stream and reads the source at once; a copy
// to it returns when the copy is done. Pinned host memory is read or written when the
// copy runs, and is tracked like device memory.
static cudaError_t copy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t stream,
                        const char *api)
{
    if (n == 0) return cudaSuccess;
    const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    char what[64];
    snprintf(what, sizeof what, "%s (destination)", api);
    check_range(what, dst, n, dst_dev);
    snprintf(what, sizeof what, "%s (source)", api);
    check_range(what, src, n, src_dev);
    char why[256];
    const bool src_pageable = classify(src, n, why, sizeof why) == MEM_UNREGISTERED;
    const bool dst_pageable = classify(dst, n, why, sizeof why) == MEM_UNREGISTERED;
    const mem_access acc[2] = {{src, n, false}, {dst, n, true}};
    if (src_pageable || dst_pageable)
        if (cudaError_t e = capture_refuses_pageable(stream, api)) return e;
    bool issued;
    if (src_pageable) {
        host_waits_stream(stream);
        auto staged = std::make_shared<std::vector<unsigned char>>((const unsigned char *)src,
                                                                   (const unsigned char *)src + n);
        issued = stream_work(stream, api, nullptr, 0, acc, 2,
                             [dst, staged] { memcpy(dst, staged->data(), staged->size()); });
    } else {
        issued = stream_work(stream, api, nullptr, 0, acc, 2, [dst, src, n] { memmove(dst, src, n); });
    }
    if (!issued) return cudaPeekAtLastError();
    if (dst_pageable) host_waits_stream(stream);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t stream)
{
    return copy(dst, src, n, kind, stream, "cudaMemcpyAsync");
}

// On the legacy default stream, and the host waits for it.
cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    if (cudaError_t e = capture_refuses_unsafe("cudaMemcpy")) return e;
    const cudaError_t r = copy(dst, src, n, kind, nullptr, "cudaMemcpy");
    if (r != cudaSuccess) return r;
    note_host_sync();
    host_waits_stream(nullptr);
    return r;
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t stream)
{
    if (n == 0) return cudaSuccess;
    check_range("cudaMemset", p, n, true);
    const mem_access acc = {p, n, true};
    if (!stream_work(stream, "cudaMemset", nullptr, 0, &acc, 1, [p, v, n] { memset(p, v, n); }))
        return cudaPeekAtLastError();
    return cudaSuccess;
}

cudaError_t cudaMemset(void *p, int v, size_t n) { return cudaMemsetAsync(p, v, n, nullptr); }

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p)
{
    memset(a, 0, sizeof *a);
    char why[256];
    switch (classify(p, 1, why, sizeof why)) {
    case MEM_DEVICE:
        a->type = cudaMemoryTypeDevice;
        a->devicePointer = const_cast<void *>(p);
        break;
    case MEM_HOST:
        a->type = cudaMemoryTypeHost;
        a->hostPointer = a->devicePointer = const_cast<void *>(p);
        break;
    case MEM_BAD: fail(nullptr, 0, "cudaPointerGetAttributes: %s", why);
    default: a->type = cudaMemoryTypeUnregistered; a->hostPointer = const_cast<void *>(p);
    }
    a->device = current_device;
    return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *func, enum cudaFuncAttribute attr, int value)
{
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) {
        fprintf(stderr, "moetrain CUDA emulator: cudaFuncSetAttribute(%d) is not emulated\n", (int)attr);
        return ret(cudaErrorInvalidValue);
    }
    if (value < 0 || value > device_smem_optin()) {
        fprintf(stderr,
                "moetrain CUDA emulator: cudaFuncSetAttribute: %d bytes of dynamic shared memory; the device allows "
                "%d\n",
                value, device_smem_optin());
        return ret(cudaErrorInvalidValue);
    }
    std::lock_guard<std::mutex> lock(attr_mu);
    smem_granted[func] = (size_t)value;
    return cudaSuccess;
}

// A model, not the hardware's calculation: 2048 threads and 64K registers per SM,
// 128 registers per thread assumed (shared memory per kernel is not known here).
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *n, const void *, int block, size_t)
{
    if (block <= 0 || block > 1024) return ret(cudaErrorInvalidValue);
    int by_threads = 2048 / block, by_regs = 65536 / (block * 128);
    *n = by_threads < by_regs ? by_threads : by_regs;
    if (*n > 32) *n = 32;
    if (*n < 1) *n = 1;
    return cudaSuccess;
}

} // extern "C"

namespace mt_emu {
// For the library emulations (cub): [p, p + bytes) must be live device memory.
void check_device_range(const char *api, const void *p, size_t bytes) { check_range(api, p, bytes, true); }
} // namespace mt_emu
