/* The guard backend: results equal the CPU backend's, backend memory is out of reach
 * of host code outside an op (a read faults, naming the allocation), and ops refuse
 * host pointers for tensors and backend pointers for host values. The failing cases
 * run in a child process, whose exit signal and stderr are checked. */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels/kernels.h"

static const struct mt_kernels *G;

/* Runs f in a child with stderr captured; returns its wait status, its stderr in msg. */
static int in_child(void (*f)(void), char *msg, size_t len)
{
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        signal(SIGSEGV, SIG_DFL); /* not cmocka's: the guard installs its own on alloc */
        signal(SIGABRT, SIG_DFL);
        f();
        _exit(0);
    }
    close(fd[1]);
    size_t got = 0;
    ssize_t n;
    while (got + 1 < len && (n = read(fd[0], msg + got, len - 1 - got)) > 0) got += (size_t)n;
    msg[got] = '\0';
    close(fd[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    return status;
}

static void test_same_results(void **state)
{
    (void)state;
    const struct mt_kernels *C = mt_kernels_cpu();
    enum mt_op missing;
    assert_int_equal(mt_kernels_count_ops(G, &missing), MT_OP_COUNT);
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {0.5f, -1, 2, 0.25f, 3, -2}, want[4], got[4];
    C->op.gemm(C->ctx, false, false, 2, 2, 3, 1.0f, mt_f32(a, 2, 3), mt_f32(b, 3, 2), 0.0f,
               mt_f32(want, 2, 2));
    float *da = G->op.alloc(G->ctx, sizeof a), *db = G->op.alloc(G->ctx, sizeof b),
          *dc = G->op.alloc(G->ctx, sizeof got);
    assert_true(da && db && dc);
    assert_true(mt_guard_owns(da, sizeof a) && !mt_guard_owns(a, sizeof a));
    assert_false(mt_guard_owns(da, sizeof a + 4096)); /* past the end of the allocation */
    G->op.copy(G->ctx, da, a, sizeof a);
    G->op.copy(G->ctx, db, b, sizeof b);
    G->op.gemm(G->ctx, false, false, 2, 2, 3, 1.0f, mt_f32(da, 2, 3), mt_f32(db, 3, 2), 0.0f,
               mt_f32(dc, 2, 2));
    G->op.copy(G->ctx, got, dc, sizeof got);
    assert_memory_equal(want, got, sizeof got);
    /* bf16 operands and a bf16 result: the values are bf16-exact, so the product is too */
    uint16_t *hb = G->op.alloc(G->ctx, 6 * sizeof(uint16_t)), *hc = G->op.alloc(G->ctx, 8);
    G->op.convert(G->ctx, mt_tview(hb, MT_BF16, 3, 2), mt_f32(db, 3, 2));
    G->op.gemm(G->ctx, false, false, 2, 2, 3, 1.0f, mt_f32(da, 2, 3), mt_tview(hb, MT_BF16, 3, 2),
               0.0f, mt_tview(hc, MT_BF16, 2, 2));
    G->op.convert(G->ctx, mt_f32(dc, 2, 2), mt_tview(hc, MT_BF16, 2, 2));
    G->op.copy(G->ctx, got, dc, sizeof got);
    assert_memory_equal(want, got, sizeof got);
    G->op.free(G->ctx, hb);
    G->op.free(G->ctx, hc);
    double s = 0.0, *ds = G->op.alloc(G->ctx, sizeof s);
    G->op.memset(G->ctx, ds, 0, sizeof s);
    G->op.sumsq(G->ctx, ds, da, 6);
    G->op.copy(G->ctx, &s, ds, sizeof s);
    assert_true(s == 91.0);
    /* open/close nest: memory stays reachable until the outermost close */
    mt_guard_open();
    mt_guard_open();
    mt_guard_close();
    assert_true(da[0] == 1.0f);
    mt_guard_close();
    G->op.free(G->ctx, da);
    G->op.free(G->ctx, db);
    G->op.free(G->ctx, dc);
    G->op.free(G->ctx, ds);
}

static volatile float sink;
static void read_outside_op(void)
{
    float *d = G->op.alloc(G->ctx, 4096 * 3);
    sink = d[1030]; /* host code reading backend memory */
}

static void host_tensor(void)
{
    float x[4] = {1, 2, 3, 4};
    float *d = G->op.alloc(G->ctx, sizeof x);
    G->op.add(G->ctx, mt_f32(d, 1, 4), mt_f32(d, 1, 4), mt_f32(x, 1, 4), 4); /* b is host memory */
}

static void wrong_shape(void)
{
    float *a = G->op.alloc(G->ctx, sizeof(float) * 6), *c = G->op.alloc(G->ctx, sizeof(float) * 4);
    /* A is 2 x 3 but the op says M = 2, K = 2 */
    G->op.gemm(G->ctx, false, false, 2, 2, 2, 1.0f, mt_f32(a, 2, 3), mt_f32(a, 2, 2), 0.0f,
               mt_f32(c, 2, 2));
}

static void past_the_end(void)
{
    float *x = G->op.alloc(G->ctx, sizeof(float) * 4), *y = G->op.alloc(G->ctx, sizeof(float) * 8);
    G->op.swiglu_fwd(G->ctx, mt_f32(y, 2, 4), mt_f32(x, 2, 4), mt_f32(y, 2, 4), 2, 4);
}

static void fp8_operand(void)
{
    float *x = G->op.alloc(G->ctx, sizeof(float) * 4);
    G->op.add(G->ctx, mt_f32(x, 1, 4), mt_tview(x, MT_E4M3, 1, 4), mt_f32(x, 1, 4), 4);
}

static void host_loss(void)
{
    float *logits = G->op.alloc(G->ctx, sizeof(float) * 8), *lse = G->op.alloc(G->ctx, 8);
    double acc = 0.0;
    G->op.memset(G->ctx, logits, 0, sizeof(float) * 8);
    G->op.z_loss_fwd(G->ctx, &acc, lse, logits, 2, 4, 1.0f); /* the accumulator is on the device */
}

static void free_host_memory(void)
{
    G->op.free(G->ctx, G->op.alloc_host(G->ctx, 64)); /* host memory given to free */
}

static void free_host_of_device(void)
{
    G->op.free_host(G->ctx, G->op.alloc(G->ctx, 64)); /* backend memory given to free_host */
}

/* alloc_host memory is host memory: the host touches it, copy takes it on either side,
 * an op refuses it as a tensor */
static void test_host_memory(void **state)
{
    (void)state;
    float *h = G->op.alloc_host(G->ctx, sizeof(float) * 4);
    float *d = G->op.alloc(G->ctx, sizeof(float) * 4);
    assert_non_null(h);
    for (int i = 0; i < 4; i++) h[i] = (float)i + 0.5f;
    G->op.copy(G->ctx, d, h, sizeof(float) * 4);
    memset(h, 0, sizeof(float) * 4);
    G->op.copy(G->ctx, h, d, sizeof(float) * 4);
    for (int i = 0; i < 4; i++) assert_true(h[i] == (float)i + 0.5f);
    G->op.free(G->ctx, d);
    G->op.free_host(G->ctx, h);

    char msg[1024];
    int st = in_child(free_host_memory, msg, sizeof msg);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    assert_non_null(strstr(msg, "is host memory from alloc_host; free it with free_host"));
    st = in_child(free_host_of_device, msg, sizeof msg);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    assert_non_null(strstr(msg, "is backend memory from alloc; free it with free"));
}

/* What a device would make the host do: every op a launch, a synchronisation for sync
 * and for a copy touching host memory, none for a copy between backend buffers. */
static void test_counts(void **state)
{
    (void)state;
    struct mt_op_counts a, b;
    assert_non_null(G->counts);
    G->counts(G->ctx, &a);
    float h[4] = {1, 2, 3, 4};
    float *d = G->op.alloc(G->ctx, sizeof h), *e = G->op.alloc(G->ctx, sizeof h);
    G->op.copy(G->ctx, d, h, sizeof h);                     /* to the device: waits */
    G->op.copy(G->ctx, e, d, sizeof h);                     /* device to device: queued */
    G->op.add(G->ctx, mt_f32(e, 1, 4), mt_f32(d, 1, 4), mt_f32(e, 1, 4), 4);
    G->op.sync(G->ctx);
    G->op.copy(G->ctx, h, e, sizeof h);                     /* back: waits */
    G->counts(G->ctx, &b);
    assert_int_equal(b.syncs[MT_OP_COPY] - a.syncs[MT_OP_COPY], 2);
    assert_int_equal(b.syncs[MT_OP_SYNC] - a.syncs[MT_OP_SYNC], 1);
    assert_int_equal(b.launches[MT_OP_ADD] - a.launches[MT_OP_ADD], 1);
    assert_int_equal(b.syncs[MT_OP_ADD] - a.syncs[MT_OP_ADD], 0);
    assert_true(h[0] == 2 && h[3] == 8);
    G->op.free(G->ctx, d);
    G->op.free(G->ctx, e);
}

static void test_faults(void **state)
{
    (void)state;
    char msg[1024];
    int st = in_child(read_outside_op, msg, sizeof msg);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV);
    assert_non_null(strstr(msg, "host code touched backend memory"));
    assert_non_null(strstr(msg, "byte 4120 of allocation"));

    st = in_child(host_tensor, msg, sizeof msg);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    assert_non_null(strstr(msg, "add: argument 'b'"));
    assert_non_null(strstr(msg, "is host memory"));

    st = in_child(wrong_shape, msg, sizeof msg);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    assert_non_null(strstr(msg, "gemm: argument 'A'"));
    assert_non_null(strstr(msg, "is 2 x 3 where the op's sizes say 2 x 2"));

    st = in_child(past_the_end, msg, sizeof msg);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    assert_non_null(strstr(msg, "swiglu_fwd: argument 'gate'"));
    assert_non_null(strstr(msg, "runs past the end of its allocation"));

    st = in_child(fp8_operand, msg, sizeof msg);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    assert_non_null(strstr(msg, "add: argument 'a'"));
    assert_non_null(strstr(msg, "has a dtype this op does not take"));

    st = in_child(host_loss, msg, sizeof msg);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    assert_non_null(strstr(msg, "z_loss_fwd: argument 'acc'"));
    assert_non_null(strstr(msg, "is host memory"));
}

/* ---- the copy stream (copy_async, events) ----
 * The children run no OpenMP op: the parent's OpenMP runtime does not survive fork. */

/* A device buffer of n floats written on the compute stream, and a host block. */
static void copy_setup(float **d, float **h, size_t n)
{
    *d = G->op.alloc(G->ctx, sizeof(float) * n);
    *h = G->op.alloc_host(G->ctx, sizeof(float) * n);
    for (size_t i = 0; i < n; i++) (*h)[i] = (float)i;
    G->op.copy(G->ctx, *d, *h, sizeof(float) * n);
}

/* The copy stream waits for the compute stream (ev), copies, records done; the
 * compute stream waits for done before it touches the buffer again. */
static void copy_ordered(void)
{
    float *d, *h;
    copy_setup(&d, &h, 16);
    void *ev = G->op.event_create(G->ctx), *done = G->op.event_create(G->ctx);
    G->op.event_record(G->ctx, ev, MT_STREAM_COMPUTE);
    G->op.event_wait(G->ctx, MT_STREAM_COPY, ev);
    G->op.copy_async(G->ctx, h, d, sizeof(float) * 16);
    G->op.event_record(G->ctx, done, MT_STREAM_COPY);
    G->op.event_wait(G->ctx, MT_STREAM_COMPUTE, done);
    G->op.memset(G->ctx, d, 0, sizeof(float) * 16);
    for (int i = 0; i < 16; i++)
        if (h[i] != (float)i) abort();
}

/* The copy stream did not wait for the copy that wrote d. */
static void copy_before_compute(void)
{
    float *d, *h;
    copy_setup(&d, &h, 16);
    G->op.copy_async(G->ctx, h, d, sizeof(float) * 16);
}

/* The compute stream writes d while its copy to the host has not been waited for. */
static void write_during_copy(void)
{
    float *d, *h;
    copy_setup(&d, &h, 16);
    void *ev = G->op.event_create(G->ctx);
    G->op.event_record(G->ctx, ev, MT_STREAM_COMPUTE);
    G->op.event_wait(G->ctx, MT_STREAM_COPY, ev);
    G->op.copy_async(G->ctx, h, d, sizeof(float) * 16);
    G->op.memset(G->ctx, d + 4, 0, sizeof(float) * 4);
}

/* The compute stream reads d, reloaded from the host, before waiting for the copy
 * (an event recorded before the copy orders nothing). */
static void read_before_reload(void)
{
    float *d, *h;
    copy_setup(&d, &h, 16);
    void *ev = G->op.event_create(G->ctx), *early = G->op.event_create(G->ctx);
    G->op.event_record(G->ctx, early, MT_STREAM_COPY);
    G->op.event_record(G->ctx, ev, MT_STREAM_COMPUTE);
    G->op.event_wait(G->ctx, MT_STREAM_COPY, ev);
    G->op.copy_async(G->ctx, d, h, sizeof(float) * 16);
    G->op.event_wait(G->ctx, MT_STREAM_COMPUTE, early);
    float *e = G->op.alloc(G->ctx, sizeof(float) * 16);
    G->op.copy(G->ctx, e, d, sizeof(float) * 16);
}

static void test_copy_stream(void **state)
{
    (void)state;
    char msg[1024];
    int st = in_child(copy_ordered, msg, sizeof msg);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);

    st = in_child(copy_before_compute, msg, sizeof msg);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    assert_non_null(strstr(msg, "copy_async: argument 'src'"));
    assert_non_null(strstr(msg, "which has not waited for the last"));
    assert_non_null(strstr(msg, "op(s) queued on the compute stream (event_record on compute, event_wait on copy first)"));

    st = in_child(write_during_copy, msg, sizeof msg);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    assert_non_null(strstr(msg, "memset: argument 'p'"));
    assert_non_null(strstr(msg, "lies in the 64 bytes copy_async #"));

    st = in_child(read_before_reload, msg, sizeof msg);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    assert_non_null(strstr(msg, "copy: argument 'src'"));
    assert_non_null(strstr(msg, "which the compute stream has not waited for"));
}

int main(void)
{
    G = mt_kernels_guard();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_same_results),
        cmocka_unit_test(test_faults),
        cmocka_unit_test(test_host_memory),
        cmocka_unit_test(test_counts),
        cmocka_unit_test(test_copy_stream),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
