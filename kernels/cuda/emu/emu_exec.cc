// The CUDA execution emulator: kernel launches. Every thread of a block is a fiber on
// the host thread that launched the kernel; blocks run one after another. A fiber
// runs until it reaches a barrier or a warp collective, where it waits until the
// threads it synchronises with have arrived; the last to arrive checks the meeting
// (same barrier, same mask, no exited lane) and performs the collective for all.
// When no fiber can run and some have not finished, the block is deadlocked.
//
// Errors name the kernel, its launch site, the block, the thread and the source line,
// then abort (a debugger stops there; see doc/cuda-emulator.md).
#include "kernels/cuda/emu/emu_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <mutex>
#include <string>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define MT_EMU_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define MT_EMU_TSAN 1
// The emulator's bookkeeping is shared by every fiber without the synchronisation TSan
// knows of: its functions are not instrumented (the kernels are), so that only races
// of device code are reported. The model of CUDA's ordering is in the tsan_* functions.
#define MT_EMU_UNSEEN __attribute__((no_sanitize("thread")))
extern "C" void __tsan_ignore_thread_begin(void); // exported, not in the header
extern "C" void __tsan_ignore_thread_end(void);
extern "C" void __tsan_read_range_pc(void *addr, unsigned long size, void *pc);
// the emulator's own writes to memory that kernels use (its NaN poison, its lists)
static inline void unseen_begin() { __tsan_ignore_thread_begin(); }
static inline void unseen_end() { __tsan_ignore_thread_end(); }
// Blocks of one launch are unordered, but the fibers of one set run its blocks one
// after another in program order: two sets, alternating, so that blocks on different
// sets race in TSan's eyes (fibers are too costly to create per block).
#define MT_EMU_SETS 2
#else
#define MT_EMU_UNSEEN
#define MT_EMU_SETS 1
static inline void unseen_begin() {}
static inline void unseen_end() {}
#endif

namespace mt_emu {

// ---------------------------------------------------------------- context switch

#if defined(__x86_64__)
// void mt_emu_ctx_switch(void **save_sp, void *load_sp): saves the callee-saved
// registers on the current stack, stores the stack pointer in *save_sp and resumes the
// context whose stack pointer is load_sp. MXCSR and the x87 control word are not
// switched: every fiber runs in the launching thread's floating-point environment
// (device code has no way to change it), and fldcw serialises the core: it took half
// of the switch's time.
extern "C" void mt_emu_ctx_switch(void **save_sp, void *load_sp);
extern "C" void mt_emu_fiber_start(void);
asm(R"(
    .text
    .globl mt_emu_ctx_switch
    .type mt_emu_ctx_switch, @function
mt_emu_ctx_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size mt_emu_ctx_switch, .-mt_emu_ctx_switch
    .globl mt_emu_fiber_start
    .type mt_emu_fiber_start, @function
mt_emu_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size mt_emu_fiber_start, .-mt_emu_fiber_start
    .section .note.GNU-stack,"",@progbits
    .text
)");
#else
#error "the CUDA emulator's context switch is written for x86-64"
#endif

// ---------------------------------------------------------------- state

enum fstate { RUNNABLE, BLOCKED, DONE };
enum wkind { W_NONE, W_BARRIER, W_SYNCWARP, W_SHFL, W_BALLOT, W_MMA, W_LDMATRIX };

MT_EMU_UNSEEN static const char *kind_name(int k, int shfl)
{
    static const char *shfls[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync"};
    switch (k) {
    case W_BARRIER: return "__syncthreads";
    case W_SYNCWARP: return "__syncwarp";
    case W_SHFL: return shfls[shfl];
    case W_BALLOT: return "__ballot_sync";
    case W_MMA: return "mma.sync.m16n8k16";
    case W_LDMATRIX: return "ldmatrix.x4";
    default: return "?";
    }
}

struct thread_state {
    void *sp;
    char *stack; // usable stack (a guard page below it)
    thread_coords co;
    unsigned linear, warp, lane;
    fstate state;
    // what it waits at
    int kind;
    const char *file;
    int line;
    unsigned mask;
    // collective operands and results
    shfl_kind sk;
    int arg, width;
    uint64_t val, result;
    bool pred;
    float *c;
    const uint32_t *a;
    uint32_t b0, b1;
    uint32_t *r;
    uint32_t addr;
    bool trans;
#ifdef MT_EMU_ASAN
    void *fake_stack;
#endif
#ifdef MT_EMU_TSAN
    void *tsan_fiber;
    void *call_pc; // of ldmatrix, in the kernel: where TSan reports its read
#endif
};

struct static_var {
    const void *tag;
    size_t offset, bytes;
};

struct launch_state {
    launch_site site;
    void (*body)(void *);
    void *args;
    dim3 grid, block;
    size_t dyn_smem;
    uint3 block_idx;
    std::vector<thread_state> *threads;
    unsigned nthreads, alive, at_barrier;
    std::vector<unsigned> pending;   // per warp: lanes waiting at a collective
    std::vector<unsigned> exited;    // per warp: lanes that returned
    std::vector<unsigned> lane_mask; // per thread: the mask it waits with (when pending)
    std::vector<unsigned> one_mask;  // per warp: the mask every pending lane waits with, or 0
    std::vector<unsigned char> runnable; // per thread: state == RUNNABLE (what the scheduler scans)
    std::vector<static_var> statics;
    size_t static_bytes, smem_extent;
    void *sched_sp;
#ifdef MT_EMU_ASAN
    void *sched_fake;
    const void *sched_bottom;
    size_t sched_size;
#endif
#ifdef MT_EMU_TSAN
    void *sched_fiber;
#endif
};

static std::mutex g_launch_mu; // one launch at a time in the process
static launch_state *g_launch;
static thread_state *g_cur;
static std::vector<thread_state> g_threads[MT_EMU_SETS]; // stacks kept from launch to launch
static size_t g_stack_bytes;

// Shared memory of the running block: the dynamic area, then the static variables.
#ifndef MT_EMU_TSAN
alignas(128) static unsigned char g_smem[MT_EMU_SMEM_ARENA];
#else
// whole pages: each block maps fresh ones, which clears what TSan knows of the last
alignas(4096) static unsigned char g_smem[(MT_EMU_SMEM_ARENA + 4095) / 4096 * 4096];
#endif

// ---------------------------------------------------------------- errors

MT_EMU_UNSEEN static void describe_context(FILE *f)
{
    launch_state *L = g_launch;
    if (!L) return;
    fprintf(f, "  in kernel %s launched at %s:%d, grid (%u,%u,%u) x block (%u,%u,%u)\n", L->site.kernel, L->site.file,
            L->site.line, L->grid.x, L->grid.y, L->grid.z, L->block.x, L->block.y, L->block.z);
    // the block always; the thread when one is running (a deadlock lists its threads)
    fprintf(f, "  block (%u,%u,%u)", L->block_idx.x, L->block_idx.y, L->block_idx.z);
    if (g_cur)
        fprintf(f, ", thread (%u,%u,%u) [warp %u lane %u]", g_cur->co.thread_idx.x, g_cur->co.thread_idx.y,
                g_cur->co.thread_idx.z, g_cur->warp, g_cur->lane);
    fprintf(f, "\n");
}

[[noreturn]] MT_EMU_UNSEEN void fail(const char *file, int line, const char *fmt, ...)
{
    fflush(stdout);
    fprintf(stderr, "moetrain CUDA emulator: error: ");
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    if (file) fprintf(stderr, "  at %s:%d\n", file, line);
    describe_context(stderr);
    fprintf(stderr, "HINT: run the test under gdb (break mt_emu::fail) to see every emulated thread's stack; "
                    "doc/cuda-emulator.md\n");
    fflush(stderr);
    abort();
}

MT_EMU_UNSEEN void describe_fault_context(FILE *f) { describe_context(f); }

MT_EMU_UNSEEN static std::string tid_str(const thread_state &t)
{
    char b[64];
    snprintf(b, sizeof b, "(%u,%u,%u)", t.co.thread_idx.x, t.co.thread_idx.y, t.co.thread_idx.z);
    return b;
}

// ---------------------------------------------------------------- fibers

MT_EMU_UNSEEN static void switch_to_scheduler()
{
    launch_state *L = g_launch;
    thread_state *t = g_cur;
#ifdef MT_EMU_TSAN
    __tsan_switch_to_fiber(L->sched_fiber, __tsan_switch_to_fiber_no_sync);
#endif
#ifdef MT_EMU_ASAN
    __sanitizer_start_switch_fiber(t->state == DONE ? nullptr : &t->fake_stack, L->sched_bottom, L->sched_size);
#endif
    mt_emu_ctx_switch(&t->sp, L->sched_sp);
#ifdef MT_EMU_ASAN
    __sanitizer_finish_switch_fiber(t->fake_stack, &L->sched_bottom, &L->sched_size);
#endif
}

MT_EMU_UNSEEN static void run_fiber(launch_state *L, thread_state *t)
{
    g_cur = t;
#ifdef MT_EMU_TSAN
    __tsan_switch_to_fiber(t->tsan_fiber, __tsan_switch_to_fiber_no_sync);
#endif
#ifdef MT_EMU_ASAN
    __sanitizer_start_switch_fiber(&L->sched_fake, t->stack, g_stack_bytes);
#endif
    mt_emu_ctx_switch(&L->sched_sp, t->sp);
#ifdef MT_EMU_ASAN
    __sanitizer_finish_switch_fiber(L->sched_fake, nullptr, nullptr);
#endif
    g_cur = nullptr;
}

static void thread_exited(launch_state *L, thread_state *t);

#ifdef MT_EMU_TSAN
// CUDA's ordering for ThreadSanitizer. Switches through the scheduler carry none
// (no_sync). A launch is ordered after the host's work before it (g_tsan_launch: the
// host releases, every thread acquires as it starts), the host's synchronisation after
// the whole grid (g_tsan_exit: every thread releases as it returns, the host acquires
// at the end of the launch). A barrier or warp collective orders its participants:
// the thread that completes it releases on behalf of each (all have arrived and wait),
// then acquires on behalf of each, then resets the sync object, so that a meeting
// conveys nothing to the next one with other participants.
static char g_tsan_launch, g_tsan_exit, g_tsan_meet;

MT_EMU_UNSEEN static void tsan_as(thread_state *u) { __tsan_switch_to_fiber(u->tsan_fiber, __tsan_switch_to_fiber_no_sync); }

// Participants: T[base + j] for j < n, those named by mask when n <= 32.
MT_EMU_UNSEEN static void tsan_meet(std::vector<thread_state> &T, unsigned base, unsigned n, unsigned mask,
                                    thread_state *self)
{
    for (unsigned j = 0; j < n; j++)
        if (n > 32 || mask & (1u << j)) tsan_as(&T[base + j]), __tsan_release(&g_tsan_meet);
    for (unsigned j = 0; j < n; j++)
        if (n > 32 || mask & (1u << j)) tsan_as(&T[base + j]), __tsan_acquire(&g_tsan_meet);
    tsan_as(self);
    __tsan_ignore_thread_begin(); // the reset imitates a write to the object: not a race
    __tsan_mutex_destroy(&g_tsan_meet, 0);
    __tsan_ignore_thread_end();
}
#endif

MT_EMU_UNSEEN static void fiber_main(void *)
{
    launch_state *L = g_launch;
#ifdef MT_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &L->sched_bottom, &L->sched_size);
#endif
#ifdef MT_EMU_TSAN
    __tsan_acquire(&g_tsan_launch);
#endif
    L->body(L->args);
    thread_state *t = g_cur;
#ifdef MT_EMU_TSAN
    __tsan_release(&g_tsan_exit);
#endif
    t->state = DONE;
    L->runnable[t->linear] = 0;
    L->alive--;
    L->exited[t->warp] |= 1u << t->lane;
    thread_exited(L, t);
    switch_to_scheduler();
    fail(nullptr, 0, "an exited emulated thread was resumed");
}

MT_EMU_UNSEEN static void init_fiber(thread_state *t)
{
    // the frame mt_emu_ctx_switch pops: a padding word, r15..r12, rbx, rbp, return address
    uint64_t *top = reinterpret_cast<uint64_t *>(t->stack + g_stack_bytes);
    uint64_t *sp = top - 3; // return address slot: after ret the stack is 16-byte aligned
    sp[0] = reinterpret_cast<uint64_t>(&mt_emu_fiber_start);
    sp[-1] = 0;                                             // rbp
    sp[-2] = 0;                                             // rbx
    sp[-3] = 0;                                             // r12: argument
    sp[-4] = reinterpret_cast<uint64_t>(&fiber_main);       // r13: function
    sp[-5] = 0;                                             // r14
    sp[-6] = 0;                                             // r15
    sp[-7] = 0;
    t->sp = &sp[-7];
}

MT_EMU_UNSEEN static void ensure_threads(std::vector<thread_state> &set, unsigned n)
{
    if (!g_stack_bytes) {
        const char *e = getenv("MT_EMU_STACK_KB");
        g_stack_bytes = (size_t)(e && atoi(e) > 0 ? atoi(e) : 256) << 10;
    }
    while (set.size() < n) {
        const size_t guard = 4096;
        char *m = static_cast<char *>(
            mmap(nullptr, g_stack_bytes + guard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
        if (m == MAP_FAILED) fail(nullptr, 0, "cannot map a %zu-byte stack for an emulated thread", g_stack_bytes);
        mprotect(m, guard, PROT_NONE); // a stack overflow faults here
        note_stack_guard(m, guard);
        thread_state t = {};
        t.stack = m + guard;
#ifdef MT_EMU_TSAN
        t.tsan_fiber = __tsan_create_fiber(0);
#endif
        set.push_back(t);
    }
}

// ---------------------------------------------------------------- barriers

MT_EMU_UNSEEN static void wait_here(thread_state *t, int kind, const char *file, int line)
{
    t->state = BLOCKED;
    g_launch->runnable[t->linear] = 0;
    t->kind = kind;
    t->file = file;
    t->line = line;
}

MT_EMU_UNSEEN static void release_barrier(launch_state *L)
{
    std::vector<thread_state> &T = *L->threads;
    const thread_state *first = nullptr;
    for (unsigned i = 0; i < L->nthreads; i++) {
        const thread_state &u = T[i];
        if (!first) first = &u;
        else if (u.file != first->file || u.line != first->line)
            fail(nullptr, 0,
                 "divergent __syncthreads: thread %s waits at %s:%d, thread %s at %s:%d (every thread of the block "
                 "must reach the same barrier)",
                 tid_str(*first).c_str(), first->file, first->line, tid_str(u).c_str(), u.file, u.line);
    }
    for (unsigned i = 0; i < L->nthreads; i++) {
        T[i].state = RUNNABLE;
        L->runnable[i] = 1;
        T[i].kind = W_NONE;
    }
    L->at_barrier = 0;
}

MT_EMU_UNSEEN void syncthreads(const char *file, int line)
{
    thread_state *t = g_cur;
    launch_state *L = g_launch;
    if (!t) fail(file, line, "__syncthreads outside a kernel");
    wait_here(t, W_BARRIER, file, line);
    L->at_barrier++;
    if (L->at_barrier == L->alive) {
        for (unsigned i = 0; i < L->nthreads; i++)
            if ((*L->threads)[i].state == DONE) {
                g_cur = t;
                fail(file, line,
                     "__syncthreads is not reached by every thread of the block: thread %s returned from the kernel "
                     "without reaching it",
                     tid_str((*L->threads)[i]).c_str());
            }
        release_barrier(L);
#ifdef MT_EMU_TSAN
        tsan_meet(*L->threads, 0, L->nthreads, ~0u, t);
#endif
    } else {
        switch_to_scheduler();
    }
}

// ---------------------------------------------------------------- warp collectives

static void perform(launch_state *L, unsigned warp, unsigned mask, thread_state *lead);

// The lane t arrives at a collective with its operands recorded; returns when the
// collective has been performed (by t or by the last lane to arrive).
MT_EMU_UNSEEN static void collective(thread_state *t, int kind, unsigned mask, const char *file, int line)
{
    launch_state *L = g_launch;
    if (!(mask & (1u << t->lane)))
        fail(file, line, "%s with mask 0x%08x, which does not name the calling lane %u", kind_name(kind, t->sk), mask,
             t->lane);
    std::vector<thread_state> &T = *L->threads;
    const unsigned w = t->warp, base = w * 32;
    const unsigned lanes = L->nthreads - base >= 32 ? 0xffffffffu : (1u << (L->nthreads - base)) - 1;
    if (mask & ~lanes)
        fail(file, line, "%s with mask 0x%08x names lane %d, which does not exist (the block has %u threads)",
             kind_name(kind, t->sk), mask, __builtin_ctz(mask & ~lanes), L->nthreads);
    if (mask & L->exited[w])
        fail(file, line, "%s with mask 0x%08x names lane %d, which has returned from the kernel",
             kind_name(kind, t->sk), mask, __builtin_ctz(mask & L->exited[w]));
    // every pending lane named by mask must wait with mask (one comparison when all
    // pending lanes share one mask, the usual case)
    if (!L->pending[w]) L->one_mask[w] = mask;
    else if (L->one_mask[w] != mask) {
        for (unsigned pm = L->pending[w] & mask; pm; pm &= pm - 1) {
            const unsigned j = (unsigned)__builtin_ctz(pm);
            if (L->lane_mask[base + j] != mask) {
                const thread_state &u = T[base + j];
                fail(file, line, "%s: lane %u passes mask 0x%08x but lane %u waits at %s (%s:%d) with mask 0x%08x",
                     kind_name(kind, t->sk), t->lane, mask, j, kind_name(u.kind, u.sk), u.file, u.line, u.mask);
            }
        }
        L->one_mask[w] = 0;
    }
    wait_here(t, kind, file, line);
    t->mask = mask;
    L->lane_mask[base + t->lane] = mask;
    L->pending[t->warp] |= 1u << t->lane;
    if ((L->pending[t->warp] & mask) == mask) {
        perform(L, t->warp, mask, t);
#ifdef MT_EMU_TSAN
        tsan_meet(T, base, 32, mask, t);
        if (kind == W_LDMATRIX) {
            // the rows are read at the meeting: after every lane's earlier work, before
            // any lane's later work (each lane reads the row it gave)
            for (unsigned j = 0; j < 32; j++) {
                tsan_as(&T[base + j]);
                __tsan_read_range_pc(g_smem + T[base + j].addr, 16, T[base + j].call_pc);
            }
            tsan_meet(T, base, 32, mask, t);
        }
#endif
    } else {
        switch_to_scheduler();
    }
}

MT_EMU_UNSEEN static uint32_t smem_word(uint32_t addr, unsigned col, const thread_state &u)
{
    uint16_t v;
    memcpy(&v, g_smem + addr + 2 * col, 2);
    (void)u;
    return v;
}

MT_EMU_UNSEEN static float bf16_lo(uint32_t r) { return uint_as_float(r << 16); }
MT_EMU_UNSEEN static float bf16_hi(uint32_t r) { return uint_as_float(r & 0xffff0000u); }

MT_EMU_UNSEEN static void perform(launch_state *L, unsigned warp, unsigned mask, thread_state *lead)
{
    std::vector<thread_state> &T = *L->threads;
    thread_state *lane[32] = {};
    const unsigned base = warp * 32;
    for (unsigned j = 0; j < 32; j++)
        if (mask & (1u << j)) lane[j] = &T[base + j];
    // the meeting: every lane at the same kind of collective, at the same place
    // (__syncwarp may be met from different places)
    for (unsigned j = 0; j < 32; j++) {
        thread_state *u = lane[j];
        if (!u) continue;
        if (u->mask != mask)
            fail(u->file, u->line, "%s: lanes of warp %u pass different masks (lane %u 0x%08x, lane %u 0x%08x)",
                 kind_name(u->kind, u->sk), warp, lead->lane, mask, j, u->mask);
        if (u->kind != lead->kind || (u->kind == W_SHFL && u->sk != lead->sk) ||
            (u->kind != W_SYNCWARP && (u->file != lead->file || u->line != lead->line)))
            fail(lead->file, lead->line,
                 "divergent warp collective: lane %u is at %s (%s:%d), lane %u at %s (%s:%d) with the same mask",
                 lead->lane, kind_name(lead->kind, lead->sk), lead->file, lead->line, j, kind_name(u->kind, u->sk),
                 u->file, u->line);
    }
    switch (lead->kind) {
    case W_SYNCWARP: break;
    case W_BALLOT: {
        unsigned bits = 0;
        for (unsigned j = 0; j < 32; j++)
            if (lane[j] && lane[j]->pred) bits |= 1u << j;
        for (unsigned j = 0; j < 32; j++)
            if (lane[j]) lane[j]->result = bits;
        break;
    }
    case W_SHFL:
        for (unsigned j = 0; j < 32; j++) {
            thread_state *u = lane[j];
            if (!u) continue;
            const int w = u->width;
            if (w < 1 || w > 32 || (w & (w - 1)))
                fail(u->file, u->line, "shuffle width %d is not a power of two in 1..32", w);
            const int seg = (int)j & ~(w - 1);
            int src = (int)j;
            switch (u->sk) {
            case SHFL_IDX: src = seg + (u->arg & (w - 1)); break;
            case SHFL_UP: src = (int)j - u->arg >= seg ? (int)j - u->arg : (int)j; break;
            case SHFL_DOWN: src = (int)j + u->arg < seg + w ? (int)j + u->arg : (int)j; break;
            case SHFL_XOR: src = (((int)j ^ u->arg) & ~(w - 1)) == seg ? (int)j ^ u->arg : (int)j; break;
            }
            if (!lane[src])
                fail(u->file, u->line,
                     "%s: lane %u reads lane %d, which is not in the mask 0x%08x (its value is undefined)",
                     kind_name(W_SHFL, u->sk), j, src, mask);
            u->result = lane[src]->val;
        }
        break;
    case W_MMA: {
        if (mask != 0xffffffffu) fail(lead->file, lead->line, "mma.sync.aligned needs all 32 lanes of the warp");
        // fragments (PTX ISA, mma.m16n8k16, .bf16): g = lane / 4, t = lane % 4
        //   A: a0 (g, 2t..2t+1) a1 (g+8, 2t..) a2 (g, 2t+8..) a3 (g+8, 2t+8..)
        //   B: b0 (k 2t..2t+1, n g) b1 (k 2t+8.., n g)
        //   C, D: c0 c1 (g, 2t..2t+1) c2 c3 (g+8, 2t..2t+1)
        double A[16][16], B[16][8], S[16][8] = {};
        float Cm[16][8];
        for (unsigned l = 0; l < 32; l++) {
            const thread_state *u = lane[l];
            const unsigned g = l / 4, q = l % 4;
            for (int r = 0; r < 4; r++) {
                const unsigned row = g + (r & 1) * 8, col = 2 * q + (r >> 1) * 8;
                A[row][col] = bf16_lo(u->a[r]);
                A[row][col + 1] = bf16_hi(u->a[r]);
            }
            B[2 * q][g] = bf16_lo(u->b0);
            B[2 * q + 1][g] = bf16_hi(u->b0);
            B[2 * q + 8][g] = bf16_lo(u->b1);
            B[2 * q + 9][g] = bf16_hi(u->b1);
            for (int e = 0; e < 4; e++) Cm[g + (e >> 1) * 8][2 * q + (e & 1)] = u->c[e];
        }
        // bf16 products are exact in fp32 and fp64; the 16 are summed in fp64 (k in
        // order, every output at once) and added to c with one rounding (a tensor
        // core's order is not specified)
        for (int k = 0; k < 16; k++)
            for (int row = 0; row < 16; row++)
                for (int col = 0; col < 8; col++) S[row][col] += A[row][k] * B[k][col];
        for (unsigned l = 0; l < 32; l++) {
            const unsigned g = l / 4, q = l % 4;
            for (int e = 0; e < 4; e++) {
                const unsigned row = g + (e >> 1) * 8, col = 2 * q + (e & 1);
                lane[l]->c[e] = (float)((double)Cm[row][col] + S[row][col]);
            }
        }
        break;
    }
    case W_LDMATRIX: {
        if (mask != 0xffffffffu) fail(lead->file, lead->line, "ldmatrix.sync.aligned needs all 32 lanes of the warp");
        for (unsigned l = 0; l < 32; l++) {
            const thread_state *u = lane[l];
            if (u->addr % 16 || (size_t)u->addr + 16 > L->smem_extent)
                fail(u->file, u->line,
                     "ldmatrix: lane %u gives shared address %u, %s (the block's shared memory is %zu bytes)", l,
                     u->addr, u->addr % 16 ? "not 16-byte aligned" : "past the end of shared memory", L->smem_extent);
        }
        // lane l receives, of matrix i (rows given by lanes 8i..8i+7): row l/4, columns
        // 2(l%4), 2(l%4)+1; with .trans element (row, col) is read transposed
        for (unsigned l = 0; l < 32; l++) {
            thread_state *u = lane[l];
            for (int i = 0; i < 4; i++) {
                uint32_t lo, hi;
                if (!u->trans) {
                    const thread_state &src = *lane[8 * i + l / 4];
                    lo = smem_word(src.addr, 2 * (l % 4), src);
                    hi = smem_word(src.addr, 2 * (l % 4) + 1, src);
                } else {
                    const thread_state &s0 = *lane[8 * i + 2 * (l % 4)], &s1 = *lane[8 * i + 2 * (l % 4) + 1];
                    lo = smem_word(s0.addr, l / 4, s0);
                    hi = smem_word(s1.addr, l / 4, s1);
                }
                u->r[i] = lo | hi << 16;
            }
        }
        break;
    }
    default: fail(lead->file, lead->line, "unknown collective");
    }
    for (unsigned j = 0; j < 32; j++)
        if (lane[j]) {
            lane[j]->state = RUNNABLE;
            L->runnable[base + j] = 1;
            lane[j]->kind = W_NONE;
        }
    L->pending[warp] &= ~mask;
}

MT_EMU_UNSEEN static thread_state *current(const char *what, const char *file, int line)
{
    if (!g_cur) fail(file, line, "%s outside a kernel", what);
    return g_cur;
}

MT_EMU_UNSEEN void syncwarp(unsigned mask, const char *file, int line)
{
    thread_state *t = current("__syncwarp", file, line);
    collective(t, W_SYNCWARP, mask, file, line);
}

MT_EMU_UNSEEN uint64_t shfl(shfl_kind kind, unsigned mask, uint64_t bits, int arg, int width, const char *file, int line)
{
    thread_state *t = current("a shuffle", file, line);
    t->sk = kind;
    t->val = bits;
    t->arg = arg;
    t->width = width;
    collective(t, W_SHFL, mask, file, line);
    return t->result;
}

MT_EMU_UNSEEN unsigned ballot(unsigned mask, bool pred, const char *file, int line)
{
    thread_state *t = current("__ballot_sync", file, line);
    t->pred = pred;
    collective(t, W_BALLOT, mask, file, line);
    return (unsigned)t->result;
}

MT_EMU_UNSEEN void mma_m16n8k16_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1, const char *file, int line)
{
    thread_state *t = current("mma.sync", file, line);
    t->c = c;
    t->a = a;
    t->b0 = b0;
    t->b1 = b1;
    collective(t, W_MMA, 0xffffffffu, file, line);
}

MT_EMU_UNSEEN void ldmatrix_x4(uint32_t r[4], uint32_t smem_addr, bool trans, const char *file, int line)
{
    thread_state *t = current("ldmatrix", file, line);
    t->r = r;
    t->addr = smem_addr;
    t->trans = trans;
#ifdef MT_EMU_TSAN
    t->call_pc = __builtin_return_address(0);
#endif
    collective(t, W_LDMATRIX, 0xffffffffu, file, line);
}

MT_EMU_UNSEEN static void thread_exited(launch_state *L, thread_state *t)
{
    // a lane still awaited by a collective
    std::vector<thread_state> &T = *L->threads;
    const unsigned base = t->warp * 32, pend = L->pending[t->warp];
    for (unsigned p = pend, j; p; p &= p - 1)
        if (j = (unsigned)__builtin_ctz(p), T[base + j].mask & (1u << t->lane)) {
            const thread_state &u = T[base + j];
            fail(u.file, u.line, "lane %u waits at %s with mask 0x%08x, which names lane %u; that lane returned from "
                 "the kernel", j, kind_name(u.kind, u.sk), u.mask, t->lane);
        }
    if (L->at_barrier && L->at_barrier == L->alive) {
        const thread_state *w = nullptr;
        for (unsigned i = 0; i < L->nthreads && !w; i++)
            if (T[i].state == BLOCKED && T[i].kind == W_BARRIER) w = &T[i];
        fail(w ? w->file : nullptr, w ? w->line : 0,
             "__syncthreads is not reached by every thread of the block: thread %s returned from the kernel without "
             "reaching it", tid_str(*t).c_str());
    }
}

// ---------------------------------------------------------------- deadlock

[[noreturn]] MT_EMU_UNSEEN static void deadlock(launch_state *L)
{
    std::vector<thread_state> &T = *L->threads;
    std::string where;
    unsigned shown = 0;
    for (unsigned i = 0; i < L->nthreads; i++) {
        const thread_state &u = T[i];
        if (u.state != BLOCKED) continue;
        bool seen = false;
        for (unsigned j = 0; j < i && !seen; j++)
            seen = T[j].state == BLOCKED && T[j].kind == u.kind && T[j].file == u.file && T[j].line == u.line;
        if (seen || shown >= 8) continue;
        unsigned n = 0;
        for (unsigned j = i; j < L->nthreads; j++)
            n += T[j].state == BLOCKED && T[j].kind == u.kind && T[j].file == u.file && T[j].line == u.line;
        char b[512];
        snprintf(b, sizeof b, "\n  %u thread(s) from %s wait at %s (%s:%d)", n, tid_str(u).c_str(),
                 kind_name(u.kind, u.sk), u.file, u.line);
        where += b;
        shown++;
    }
    g_cur = nullptr;
    fail(nullptr, 0, "deadlock: no emulated thread of the block can continue (%u returned):%s",
         L->nthreads - L->alive, where.c_str());
}

// ---------------------------------------------------------------- shared memory

MT_EMU_UNSEEN void *static_smem(const void *tag, size_t bytes, const char *name, const char *file, int line)
{
    launch_state *L = g_launch;
    if (!g_cur) fail(file, line, "shared variable %s outside a kernel", name);
    for (const static_var &v : L->statics)
        if (v.tag == tag) return g_smem + v.offset;
    const size_t off = (L->smem_extent + 15) / 16 * 16;
    L->static_bytes += bytes;
    if (L->static_bytes > MT_EMU_STATIC_SMEM_MAX)
        fail(file, line, "static shared memory of the kernel reaches %zu bytes with %s; the limit is %d bytes",
             L->static_bytes, name, MT_EMU_STATIC_SMEM_MAX);
    if (off + bytes > (size_t)device_smem_optin())
        fail(file, line, "shared memory of the block reaches %zu bytes with %s (%zu dynamic); the device allows %d",
             off + bytes, name, L->dyn_smem, device_smem_optin());
    unseen_begin();
    memset(g_smem + off, 0xff, bytes); // NaN, so that a read before the first write shows
    L->statics.push_back({tag, off, bytes});
    unseen_end();
    L->smem_extent = off + bytes;
    return g_smem + off;
}

MT_EMU_UNSEEN void *dynamic_smem(const char *file, int line)
{
    if (!g_cur) fail(file, line, "dynamic shared memory outside a kernel");
    return g_smem;
}

MT_EMU_UNSEEN uint32_t cvta_to_shared(const void *p, const char *file, int line)
{
    const unsigned char *c = static_cast<const unsigned char *>(p);
    if (c < g_smem || c >= g_smem + g_launch->smem_extent)
        fail(file, line, "__cvta_generic_to_shared of %p, which is not in the block's shared memory", p);
    return (uint32_t)(c - g_smem);
}

MT_EMU_UNSEEN void check_aligned(const void *p, size_t align, const char *what, const char *file, int line)
{
    if ((uintptr_t)p % align)
        fail(file, line, "%s of %zu bytes at %p: misaligned (needs %zu-byte alignment)", what, align, p, align);
}

MT_EMU_UNSEEN const thread_coords &coords(const char *file, int line)
{
    if (!g_cur) fail(file, line, "threadIdx/blockIdx/blockDim/gridDim outside a kernel");
    return g_cur->co;
}

// ---------------------------------------------------------------- the launch

static void run_grid(const launch_site &site, void (*body)(void *), void *args, dim3 grid, dim3 block, size_t smem);

void launch(const launch_site &site, const void *func, void (*body)(void *), std::shared_ptr<void> args, dim3 grid,
            dim3 block, size_t smem, cudaStream_t stream, const std::vector<mem_access> &acc)
{
    if (!capturing(stream)) note_launch(); // captured: a node of a graph, launched with it
    const unsigned long long nthreads = (unsigned long long)block.x * block.y * block.z;
    const char *bad = nullptr;
    if (nthreads == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0) bad = "an empty grid or block";
    else if (nthreads > 1024 || block.z > 64) bad = "a block of more than 1024 threads (or block.z > 64)";
    else if (grid.y > 65535 || grid.z > 65535) bad = "grid.y or grid.z above 65535";
    if (bad) {
        fprintf(stderr, "moetrain CUDA emulator: launch of %s at %s:%d with %s: invalid configuration\n", site.kernel,
                site.file, site.line, bad);
        set_last_error(cudaErrorInvalidConfiguration);
        return;
    }
    const size_t granted = dynamic_smem_granted(func);
    if (smem > granted) {
        fprintf(stderr,
                "moetrain CUDA emulator: launch of %s at %s:%d asks for %zu bytes of dynamic shared memory; "
                "the kernel may use %zu (cudaFuncSetAttribute(..., cudaFuncAttributeMaxDynamicSharedMemorySize) "
                "raises the 48 KB default up to the device's %d)\n",
                site.kernel, site.file, site.line, smem, granted, device_smem_optin());
        set_last_error(cudaErrorInvalidValue);
        return;
    }
    stream_work(stream, site.kernel, site.file, site.line, acc.data(), acc.size(),
                [site, body, args, grid, block, smem] { run_grid(site, body, args.get(), grid, block, smem); });
}

MT_EMU_UNSEEN static void run_grid(const launch_site &site, void (*body)(void *), void *args, dim3 grid, dim3 block, size_t smem)
{
    const unsigned long long nthreads = (unsigned long long)block.x * block.y * block.z;
    std::lock_guard<std::mutex> lock(g_launch_mu);
    if (g_launch) fail(site.file, site.line, "kernel %s launched from inside a kernel", site.kernel);
    ensure_threads(g_threads[0], (unsigned)nthreads);
    if (MT_EMU_SETS > 1 && (unsigned long long)grid.x * grid.y * grid.z > 1)
        ensure_threads(g_threads[MT_EMU_SETS - 1], (unsigned)nthreads);
    launch_state L = {};
    L.site = site;
    L.body = body;
    L.args = args;
    L.grid = grid;
    L.block = block;
    L.dyn_smem = smem;
    L.nthreads = (unsigned)nthreads;
    L.pending.assign((L.nthreads + 31) / 32, 0);
    L.lane_mask.assign(L.nthreads, 0);
    L.one_mask.assign((L.nthreads + 31) / 32, 0);
    L.runnable.assign(L.nthreads, 0);
#ifdef MT_EMU_TSAN
    L.sched_fiber = __tsan_get_current_fiber();
    __tsan_release(&g_tsan_launch);
    static uint64_t launches;
    const uint64_t launch_no = launches++;
#endif
    g_launch = &L;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                L.block_idx = make_uint3(bx, by, bz);
                unsigned set = 0;
#ifdef MT_EMU_TSAN
                // blocks 2k and 2k+1 on different sets, any other two on different sets
                // with probability 1/2, drawn per launch (splitmix64); block 0 on set 0
                const uint64_t b = ((uint64_t)bz * grid.y + by) * grid.x + bx;
                uint64_t h = (b >> 1) + launch_no * 0x9e3779b97f4a7c15ull + 0x9e3779b97f4a7c15ull;
                h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
                h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
                set = (unsigned)((b ^ (b > 1 ? h ^ (h >> 31) : 0)) & 1);
#endif
                std::vector<thread_state> &T = g_threads[set];
                L.threads = &T;
                L.alive = L.nthreads;
                L.at_barrier = 0;
                L.exited.assign((L.nthreads + 31) / 32, 0);
                // fresh shared memory: NaN (0xff bytes) over what the kernel has used so far
                if (L.smem_extent < smem) L.smem_extent = smem;
                unseen_begin();
#ifdef MT_EMU_TSAN
                // fresh pages: mapping them (unseen) makes TSan forget the accesses of
                // earlier blocks, which are not ordered with this one's
                if (L.smem_extent &&
                    mmap(g_smem, (L.smem_extent + 4095) / 4096 * 4096, PROT_READ | PROT_WRITE,
                         MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED)
                    fail(nullptr, 0, "cannot map the shared memory of a block");
#endif
                memset(g_smem, 0xff, L.smem_extent);
                unseen_end();
                for (unsigned i = 0; i < L.nthreads; i++) {
                    thread_state &t = T[i];
                    t.co.thread_idx = make_uint3(i % block.x, (i / block.x) % block.y, i / (block.x * block.y));
                    t.co.block_idx = L.block_idx;
                    t.co.block_dim = block;
                    t.co.grid_dim = grid;
                    t.linear = i;
                    t.warp = i / 32;
                    t.lane = i % 32;
                    t.state = RUNNABLE;
                    L.runnable[i] = 1;
                    t.kind = W_NONE;
                    init_fiber(&t);
#ifdef MT_EMU_TSAN
                    // what TSan's reports call the thread
                    char name[160];
                    snprintf(name, sizeof name, "block (%u,%u,%u) thread (%u,%u,%u) of %s", bx, by, bz,
                             t.co.thread_idx.x, t.co.thread_idx.y, t.co.thread_idx.z, site.kernel);
                    __tsan_set_fiber_name(t.tsan_fiber, name);
#endif
                }
                while (L.alive) {
                    bool ran = false;
                    for (unsigned i = 0; i < L.nthreads; i++)
                        if (L.runnable[i]) {
                            run_fiber(&L, &T[i]);
                            ran = true;
                        }
                    if (!ran) deadlock(&L);
                }
            }
#ifdef MT_EMU_TSAN
    __tsan_acquire(&g_tsan_exit);
#endif
    g_launch = nullptr;
}

} // namespace mt_emu
