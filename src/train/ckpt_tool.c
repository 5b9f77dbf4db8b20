/* `moetrain ckpt`: tools on checkpoints outside a run. Only this file (with main.c)
 * prints; mt_ckpt_convert is the library part.
 *
 * convert: a checkpoint read whole (mt_ckpt_read: either format) is written in the
 * other format into a save directory, through the same lock, temporary directory and
 * publication as a run's save, so that the result is whole or absent. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "runtime/cli_end.h"
#include "train/ckpt_shard.h"
#include "train/train.h"

const char *mt_ckpt_format_name(enum mt_ckpt_format f)
{
    return f == MT_CKPT_STATE_BIN ? "state.bin" : "sharded";
}

static bool has_file(const char *dir, const char *name)
{
    char path[4400];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return stat(path, &sb) == 0;
}

/* The resolved configuration stored beside the source (for people), or a note. */
static char *source_config(const char *iter_dir, const char *src)
{
    char path[4400], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/config.nml", iter_dir);
    FILE *in = fopen(path, "r"), *out = open_memstream(&text, &len);
    if (!out) {
        if (in) fclose(in);
        return NULL;
    }
    if (in) {
        char buf[65536];
        size_t n;
        while ((n = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, n, out);
        fclose(in);
    } else {
        fprintf(out, "! converted by moetrain ckpt convert from '%s', which held no "
                     "config.nml\n", src);
    }
    if (fclose(out) != 0) {
        free(text);
        return NULL;
    }
    return text;
}

int mt_ckpt_convert(const char *src, const char *dst, int to, struct mt_ckpt_convert_info *info,
                    struct mt_err *err)
{
    memset(info, 0, sizeof *info);
    bool found = false;
    MT_CHECK(mt_ckpt_locate(src, false, info->src_iter, sizeof info->src_iter, &found, err));
    info->from = has_file(info->src_iter, MT_SHARD_INDEX) ? MT_CKPT_SHARDED : MT_CKPT_STATE_BIN;
    info->to = to >= 0 ? (enum mt_ckpt_format)to
                       : info->from == MT_CKPT_SHARDED ? MT_CKPT_STATE_BIN : MT_CKPT_SHARDED;
    if (has_file(dst, MT_SHARD_INDEX) || has_file(dst, "state.bin"))
        return mt_err_set(err, MT_EINVAL,
                          "ckpt convert: '%s' is a checkpoint's iter_* directory; give the "
                          "directory to save into (the checkpoint goes into DST/iter_N and "
                          "DST/latest_checkpointed_iteration.txt names it)",
                          dst);
    struct mt_ckpt_file f;
    MT_CHECK(mt_ckpt_read(info->src_iter, &f, err));
    info->iteration = f.state.iteration;
    info->ntensors = f.view.ntensors;
    info->nparams = f.view.nparams;
    char *config = source_config(info->src_iter, src);
    struct mt_ckpt_dir *d = NULL;
    int removed, restored, rc = MT_OK;
    if (!config) rc = mt_err_set(err, MT_ENOMEM, "ckpt convert: out of memory");
    if (rc == MT_OK) rc = mt_ckpt_dir_open(dst, &d, &removed, &restored, err);
    if (rc == MT_OK && info->to == MT_CKPT_STATE_BIN)
        rc = mt_ckpt_save(d, &f.view, &f.state, config, 0, err);
    else if (rc == MT_OK)
        rc = mt_ckpt_save_whole(d, &f.view, &f.state, config, err);
    if (rc == MT_OK)
        snprintf(info->dst_iter, sizeof info->dst_iter, "%s/iter_%07lld", mt_ckpt_dir_path(d),
                 f.state.iteration);
    mt_ckpt_dir_close(d);
    free(config);
    mt_ckpt_file_free(&f);
    return rc;
}

/* ---- the command line ------------------------------------------------------------ */

static void usage(FILE *out)
{
    fputs("usage: moetrain ckpt convert [--to sharded|state.bin] SRC DST\n"
          "\n"
          "convert  writes the checkpoint SRC in the other format (or the one --to names)\n"
          "         into the save directory DST: DST/iter_N, N being SRC's iteration, and\n"
          "         DST/latest_checkpointed_iteration.txt naming it, published whole or not\n"
          "         at all. SRC is a checkpoint directory (its latest checkpoint) or one of\n"
          "         its iter_* directories, in either format: the sharded one (index.json\n"
          "         and rank_*.safetensors) or the one-process state.bin. DST may be SRC's\n"
          "         own directory (the checkpoint is replaced by its conversion). The\n"
          "         checkpoint is held in memory whole (parameters and both moments).\n"
          "\n"
          "See doc/checkpoints.md.\n",
          out);
}

static int usage_error(const char *what)
{
    fprintf(stderr, "moetrain ckpt: error: %s (see moetrain ckpt --help)\n", what);
    return 1;
}

static int convert_cli(int argc, char **argv)
{
    int to = -1;
    const char *paths[2];
    int npaths = 0;
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i], *v = NULL;
        if (!strcmp(s, "--to") && i + 1 < argc) v = argv[++i];
        else if (!strncmp(s, "--to=", 5)) v = s + 5;
        else if (!strcmp(s, "--to")) return usage_error("--to needs sharded or state.bin");
        if (v) {
            if (!strcmp(v, "sharded")) to = MT_CKPT_SHARDED;
            else if (!strcmp(v, "state.bin")) to = MT_CKPT_STATE_BIN;
            else return usage_error("--to takes sharded or state.bin");
        } else if (s[0] == '-' && s[1]) {
            fprintf(stderr, "moetrain ckpt: error: unknown option '%s' (see moetrain ckpt "
                            "--help)\n", s);
            return 1;
        } else if (npaths == 2) {
            return usage_error("convert takes two paths, SRC and DST");
        } else {
            paths[npaths++] = s;
        }
    }
    if (npaths != 2) return usage_error("convert takes two paths, SRC and DST");
    struct mt_ckpt_convert_info info;
    struct mt_err err = { 0 };
    if (mt_ckpt_convert(paths[0], paths[1], to, &info, &err)) {
        mt_cli_print_error("moetrain ckpt convert", &err, "");
        return 1;
    }
    printf("moetrain ckpt convert: %s (%s) -> %s (%s): iteration %lld, %d tensors, %zu "
           "parameters\n",
           info.src_iter, mt_ckpt_format_name(info.from), info.dst_iter,
           mt_ckpt_format_name(info.to), info.iteration, info.ntensors, info.nparams);
    return 0;
}

int mt_ckpt_cli(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2;
    }
    if (!strcmp(argv[1], "convert")) {
        for (int i = 2; i < argc; i++)
            if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
                usage(stdout);
                return 0;
            }
        return convert_cli(argc - 1, argv + 1);
    }
    fprintf(stderr, "moetrain ckpt: error: unknown command '%s' (see moetrain ckpt --help)\n",
            argv[1]);
    return 1;
}
