/* moetrain: how the executables (moetrain, moetrain topo) report errors and
 * end a job of several processes. Library code never calls these: it returns
 * errors; only the programs decide to print and exit. */
#ifndef MT_RUNTIME_CLI_END_H
#define MT_RUNTIME_CLI_END_H

#include "runtime/comm.h"
#include "util/error.h"

/* Seconds a failing process waits for the others to agree before it reports
 * alone and ends the job. */
#define MT_FAIL_GRACE_S 10.0

/* Prints err on stderr as "PROG: error: [WHO: ]message", or as it is when the
 * message already carries a "file:line:col: error:" location. */
void mt_cli_print_error(const char *prog, const struct mt_err *err, const char *who);

/* The same for this process of w: other ranks than 0 (which speaks for every
 * process) name themselves, "rank R (host)". */
void mt_cli_print_rank_error(const char *prog, const struct mt_world *w,
                             const struct mt_err *err);

/* After a step that any process may have failed (rc != 0 here): the processes
 * agree, an error every process hit is printed once, one only some processes
 * hit is printed by them, and any failure ends the job with status 1 on every
 * process (cleanly when all are alive, else by aborting). Returns only when no
 * process failed. */
void mt_cli_agree_or_exit(const char *prog, struct mt_world *w, int rc,
                          const struct mt_err *err);

#endif
