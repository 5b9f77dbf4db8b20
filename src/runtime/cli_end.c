#include "runtime/cli_end.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mt_cli_print_error(const char *prog, const struct mt_err *err, const char *who)
{
    const char *sep = *who ? ": " : "";
    if (strstr(err->msg, ": error: "))
        fprintf(stderr, "%s%s%s\n", who, sep, err->msg);
    else
        fprintf(stderr, "%s: error: %s%s%s\n", prog, who, sep, err->msg);
}

void mt_cli_print_rank_error(const char *prog, const struct mt_world *w,
                             const struct mt_err *err)
{
    char who[320] = "";
    if (w->size > 1 && w->rank != 0)
        snprintf(who, sizeof who, "rank %d (%s)", w->rank, w->hostname);
    mt_cli_print_error(prog, err, who);
}

void mt_cli_agree_or_exit(const char *prog, struct mt_world *w, int rc,
                          const struct mt_err *err)
{
    double wait = w->timeout_s;
    if (rc && (wait <= 0 || wait > MT_FAIL_GRACE_S)) wait = MT_FAIL_GRACE_S;
    int nfailed = 0;
    bool report = false;
    struct mt_err aerr = { 0 };
    if (mt_world_agree(w, rc ? err : NULL, wait, &nfailed, &report, &aerr)) {
        mt_cli_print_rank_error(prog, w, rc ? err : &aerr);
        mt_world_abort(w);
    }
    if (nfailed == 0) return;
    if (report) mt_cli_print_rank_error(prog, w, err);
    fflush(stdout);
    fflush(stderr);
    /* Every process knows of the failure: wait for the reporter to have
     * printed before the job ends (an abort would kill it mid-message), then
     * leave cleanly. A barrier that cannot complete falls back to the abort. */
    struct mt_err berr = { 0 };
    if (w->size > 1 && mt_barrier(w->comm, &berr) == MT_OK) {
        mt_world_finalize(w);
        exit(1);
    }
    mt_world_abort(w);
}
