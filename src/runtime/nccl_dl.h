/* NCCL, loaded at run time (nccl_dl.c): only a GPU run of more than one process
 * opens it, so nodes without NCCL run everything else. */
#ifndef MT_RUNTIME_NCCL_DL_H
#define MT_RUNTIME_NCCL_DL_H

struct mt_err;

/* Loads NCCL (once per process); MT_EUNSUPPORTED with a message naming the library,
 * where it was looked for and how to make it found. */
int mt_nccl_load(struct mt_err *err);

#endif
