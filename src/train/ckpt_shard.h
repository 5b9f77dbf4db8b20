/* The sharded checkpoint format (doc/checkpoints.md): in an iteration directory,
 *
 *   rank_00003.safetensors   what world rank 3 owns: safetensors (an 8-byte
 *                            little-endian header length, a JSON header naming each
 *                            tensor's dtype, shape and data_offsets, then the data)
 *   index.json               every stored tensor's name, global shape and dtype; every
 *                            stored slice (the file and key holding it, its box in the
 *                            global tensor and the range of that box it holds, its
 *                            byte range, CRC-32 per block); the training state and the
 *                            layout that wrote it
 *
 * Stored tensors: each parameter under its Hugging Face name (fp32 master weights),
 * its Adam moments as optimizer.exp_avg.NAME and optimizer.exp_avg_sq.NAME, and the
 * expert biases as moetrain.expert_bias (one-dimensional: MoE layer after MoE layer).
 * A slice is a box of the global tensor (start, shape) and the elements [lo, hi) of
 * that box in row-major order: a tensor-parallel shard is a whole box, a ZeRO-1 slice
 * a range of one.
 *
 * This file writes shard files and the index, and reads: from an index, or from a
 * one-process state.bin seen the same way, each reader takes the parts of the stored
 * slices that overlap the slices it needs, a block at a time, checking each block's
 * checksum. */
#ifndef MT_TRAIN_CKPT_SHARD_H
#define MT_TRAIN_CKPT_SHARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "train/train.h"

#define MT_SHARD_INDEX "index.json"
#define MT_SHARD_FORMAT "moetrain.sharded"
#define MT_SHARD_VERSION 1
#define MT_SHARD_PREFIX_M "optimizer.exp_avg."
#define MT_SHARD_PREFIX_V "optimizer.exp_avg_sq."
#define MT_SHARD_BIAS "moetrain.expert_bias"

/* How a stored slice's elements are kept in its file (moetrain's own files: F32). */
enum mt_shard_dtype { MT_SHARD_F32 = 0, MT_SHARD_BF16 };

/* A slice of a stored tensor, and where its values are in memory. */
struct mt_shard_piece {
    char name[320];            /* the stored tensor's name */
    int ndim;
    long long start[4], shape[4]; /* the box in the global tensor */
    size_t lo, hi;             /* its elements [lo, hi), row-major */
    float *data;               /* hi - lo values */
    bool backend;              /* data is the backend's memory (copied through k->op.copy) */
};

/* p = the whole of tensor prefix+name (shape, ndim dimensions), at data in host memory. */
void mt_shard_whole_piece(struct mt_shard_piece *p, const char *prefix, const char *name,
                          int ndim, const long long *shape, float *data);

/* The checksum block, which is also the I/O buffer of reads and writes: 16 MiB, or
 * MOETRAIN_CKPT_BLOCK bytes (a multiple of 4; read once). */
size_t mt_shard_block_bytes(void);

/* Host memory the checkpoint code allocates, counted: mt_shard_mem_peak is the most
 * held at once since mt_shard_mem_reset. */
void *mt_shard_malloc(size_t bytes);
void mt_shard_free(void *p, size_t bytes);
void mt_shard_mem_reset(void);
/* Host memory allocated elsewhere for the checkpoint code (the async staging), counted
 * while held. */
void mt_shard_mem_held(size_t bytes);
void mt_shard_mem_released(size_t bytes);
size_t mt_shard_mem_peak(void);

/* The one-process format (checkpoint.c): magic, version and checksum of state.bin. */
#define MT_CKPT1_MAGIC "MTCKPT01"
#define MT_CKPT1_VERSION 1u
uint64_t mt_ckpt_fnv1a(uint64_t h, const void *p, size_t n);

/* Writes dir/file (a safetensors file, fsynced) holding the pieces in order, streamed
 * through one block; appends each slice's index entry to slices (JSON objects, each
 * followed by a comma). k copies backend pieces (NULL when all are host memory). */
int mt_shard_write(const char *dir, const char *file, const struct mt_shard_piece *p, int n,
                   const struct mt_kernels *k, size_t block, FILE *slices, struct mt_err *err);

/* Writes dir/index.json (fsynced): table's tensors (parameters, then each one's
 * moments, then the expert biases when table->nbuffers), the slices text gathered from
 * every rank (entries each followed by a comma), the state and layout (a JSON object). */
int mt_shard_write_index(const char *dir, const struct mt_ckpt_view *table,
                         const struct mt_train_state *st, const char *layout_json,
                         size_t block, const char *slices, size_t slices_len,
                         struct mt_err *err);

struct mt_shard_index;

/* Reads iter_dir's index: index.json when it has one (*text, malloc'd, gets its bytes
 * for mt_shard_index_open on other ranks), else a one-process state.bin, whose whole
 * checksum is verified here, streamed (*text NULL). */
int mt_shard_index_text(const char *iter_dir, char **text, size_t *len, struct mt_err *err);

/* Parses an index: text from mt_shard_index_text, or NULL for iter_dir's state.bin
 * (whose header is read here; its checksum is mt_shard_index_text's to verify). */
int mt_shard_index_open(const char *iter_dir, const char *text, size_t len,
                        struct mt_shard_index **out, struct mt_err *err);
void mt_shard_index_free(struct mt_shard_index *ix);

const struct mt_train_state *mt_shard_index_state(const struct mt_shard_index *ix);
/* A one-line description of the layout that wrote it ("one process" for state.bin). */
const char *mt_shard_index_layout(const struct mt_shard_index *ix);

/* Checks that the stored tensors are the model's (table: names and global shapes):
 * every parameter with both moments, nothing else, and nbuffers expert biases. */
int mt_shard_index_check(const struct mt_shard_index *ix, const struct mt_ckpt_view *table,
                         struct mt_err *err);

/* The stored parameter table (names, ndims, shapes in stored order; nbuffers): for
 * tools that read a checkpoint whole. The arrays live as long as ix. */
void mt_shard_index_table(const struct mt_shard_index *ix, struct mt_ckpt_view *table);

/* Fills every target (host memory) from the stored slices that overlap it, verifying
 * the checksums of the blocks read; a target not covered exactly is an error. */
int mt_shard_read(struct mt_shard_index *ix, const struct mt_shard_piece *t, int n,
                  struct mt_err *err);

/* Indexes put together by hand (a Hugging Face directory, hf.c; upcycling): new makes
 * an empty one reading files in dir; add records a whole slice (box start, shape) of
 * tensor name (global shape; created at its first slice) stored at byte offset of file
 * in dtype, without checksums; seal makes it readable (a tensor twice is an error).
 * replicate (on an index opened or sealed, before reading) turns tensor from into a
 * tensor `to` of copies stacked copies of it ([copies, from's shape...]: copy c is from's
 * slices again at c in the first dimension, the same bytes); from is removed. */
int mt_shard_index_new(const char *dir, struct mt_shard_index **out, struct mt_err *err);
int mt_shard_index_add(struct mt_shard_index *ix, const char *name, int ndim,
                       const long long *shape, const long long *start,
                       const long long *slice_shape, const char *file, uint64_t offset,
                       enum mt_shard_dtype dtype, struct mt_err *err);
int mt_shard_index_seal(struct mt_shard_index *ix, struct mt_err *err);
int mt_shard_index_replicate(struct mt_shard_index *ix, const char *from, const char *to,
                             long long copies, struct mt_err *err);

/* The stored tensors (of a sealed index, in name order): how many, the name, dimensions
 * and global shape of the i-th, and the position of a name (-1: none). */
int mt_shard_index_count(const struct mt_shard_index *ix);
const char *mt_shard_index_tensor(const struct mt_shard_index *ix, int i, int *ndim,
                                  long long shape[4]);
int mt_shard_index_find(const struct mt_shard_index *ix, const char *name);

/* "[a, b, c]": a shape for messages. */
void mt_shard_dims_text(int ndim, const long long *shape, char *out, size_t len);

#endif
