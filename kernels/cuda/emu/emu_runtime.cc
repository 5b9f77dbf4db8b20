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
// Streams and events execute immediately, in call order.
#include "kernels/cuda/emu/emu_internal.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <deque>
#include <map>
#include <mutex>

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
    size_t requested, rounded;
    bool freed;
    bool host; // cudaMallocHost
};

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

static void fault_handler(int sig, siginfo_t *si, void *)
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
    regions[(uintptr_t)p] = region{m, pages + 2 * page, bytes, rounded, false, host};
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
    if (a < base || a + n > base + r.requested) {
        snprintf(why, why_len, "%zu bytes at %p leave the %zu-byte allocation at %p (offset %td)", n, p, r.requested,
                 (void *)base, (ptrdiff_t)(a - base));
        return MEM_BAD;
    }
    return r.host ? MEM_HOST : MEM_DEVICE;
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
    if (n == 0) return cudaSuccess;
    *p = map_region(n, false);
    return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void *p)
{
    if (!p) return cudaSuccess;
    return ret(unmap_region(p, false, "cudaFree"));
}

cudaError_t cudaMallocHost(void **p, size_t n)
{
    *p = map_region(n ? n : 1, true);
    return *p ? cudaSuccess : ret(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void *p)
{
    if (!p) return cudaSuccess;
    return ret(unmap_region(p, true, "cudaFreeHost"));
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t)
{
    if (n == 0) return cudaSuccess;
    const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
    const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
    check_range("cudaMemcpy (destination)", dst, n, dst_dev);
    check_range("cudaMemcpy (source)", src, n, src_dev);
    memmove(dst, src, n);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind)
{
    return cudaMemcpyAsync(dst, src, n, kind, nullptr);
}

cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t)
{
    if (n == 0) return cudaSuccess;
    check_range("cudaMemset", p, n, true);
    memset(p, v, n);
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

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned)
{
    static char streams[1];
    *s = reinterpret_cast<cudaStream_t>(streams); // every stream executes at once: one will do
    return cudaSuccess;
}
cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }
cudaError_t cudaStreamDestroy(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
// Work is done when it is issued: a stream is always idle, an event always reached.
cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }

struct emu_event {
    unsigned magic;
};
static const unsigned event_magic = 0x65766e74; // "evnt"

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned)
{
    emu_event *ev = new emu_event{event_magic};
    *e = reinterpret_cast<cudaEvent_t>(ev);
    return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

static cudaError_t check_event(const char *api, cudaEvent_t e)
{
    const emu_event *ev = reinterpret_cast<const emu_event *>(e);
    if (!ev || ev->magic != event_magic) {
        fprintf(stderr, "moetrain CUDA emulator: %s(%p): not an event (never created, or destroyed)\n", api,
                (void *)e);
        return ret(cudaErrorInvalidResourceHandle);
    }
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) { return check_event("cudaEventRecord", e); }
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return check_event("cudaEventSynchronize", e); }
cudaError_t cudaEventQuery(cudaEvent_t e) { return check_event("cudaEventQuery", e); }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) { return check_event("cudaStreamWaitEvent", e); }
cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    const cudaError_t r = check_event("cudaEventDestroy", e);
    if (r != cudaSuccess) return r;
    emu_event *ev = reinterpret_cast<emu_event *>(e);
    ev->magic = 0;
    delete ev;
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
