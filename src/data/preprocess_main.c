/* moetrain-preprocess: text or JSONL in, a Megatron indexed dataset out. */
#include "config.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/data.h"

static const char usage[] =
    "Usage: moetrain-preprocess --input FILE [--input FILE ...] --output-prefix PREFIX\n"
    "                           [--json-key KEY] [--append-eod]\n"
    "\n"
    "Tokenises text into a Megatron indexed dataset, PREFIX.bin + PREFIX.idx, with a\n"
    "byte-level tokenizer: every byte of the text is one token (0..255) and token 256\n"
    "ends a document (--append-eod), so the vocabulary is 257 (model%vocab_size = 257).\n"
    "Tokens are stored as uint16, one sequence per document.\n"
    "\n"
    "Input format, by file name:\n"
    "  *.jsonl, *.json  one JSON object per line; the document is its KEY field\n"
    "                   (default \"text\"), unescaped to UTF-8 (\\uXXXX and surrogate\n"
    "                   pairs included). Blank lines are skipped.\n"
    "  anything else    plain text, one document per paragraph: the lines up to the\n"
    "                   next blank (empty or whitespace-only) line, newlines kept,\n"
    "                   blank lines dropped.\n"
    "Inputs are read in order into one dataset; documents without text are skipped.\n"
    "\n"
    "Output: PREFIX.bin and PREFIX.idx are replaced atomically (written as .tmp,\n"
    "synced, renamed). Unlike Megatron's tools/preprocess_data.py, nothing such as\n"
    "\"_text_document\" is appended to PREFIX: give PREFIX as data%data_path.\n"
    "\n"
    "Options:\n"
    "  -i, --input FILE             input file (repeatable)\n"
    "  -o, --output-prefix PREFIX   output files PREFIX.bin and PREFIX.idx\n"
    "  -k, --json-key KEY           JSON field holding the text (default: text)\n"
    "  -e, --append-eod             end every document with token 256\n"
    "  -h, --help                   this text\n"
    "  -V, --version                the moetrain version\n";

static int usage_error(const char *msg)
{
    fprintf(stderr, "moetrain-preprocess: error: %s\n(see moetrain-preprocess --help)\n", msg);
    return 2;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"input", required_argument, NULL, 'i'},
        {"output-prefix", required_argument, NULL, 'o'},
        {"json-key", required_argument, NULL, 'k'},
        {"append-eod", no_argument, NULL, 'e'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    const char **inputs = calloc((size_t)argc, sizeof *inputs);
    int ninputs = 0;
    const char *prefix = NULL;
    struct mt_preprocess_opts opts = {"text", false};
    if (!inputs) {
        fprintf(stderr, "moetrain-preprocess: error: out of memory\n");
        return 1;
    }
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "i:o:k:ehV", longopts, NULL)) != -1) {
        switch (c) {
        case 'i': inputs[ninputs++] = optarg; break;
        case 'o': prefix = optarg; break;
        case 'k': opts.json_key = optarg; break;
        case 'e': opts.append_eod = true; break;
        case 'h':
            fputs(usage, stdout);
            free(inputs);
            return 0;
        case 'V':
            printf("moetrain-preprocess (%s) %s\n", PACKAGE_NAME, PACKAGE_VERSION);
            free(inputs);
            return 0;
        default: {
            char msg[256];
            if (optopt)
                snprintf(msg, sizeof msg, "option -%c %s", optopt,
                         strchr("iok", optopt) ? "needs an argument" : "is unknown");
            else
                snprintf(msg, sizeof msg, "unknown option %s", argv[optind - 1]);
            free(inputs);
            return usage_error(msg);
        }
        }
    }
    if (optind < argc) {
        free(inputs);
        return usage_error("unexpected argument (inputs are given with --input FILE)");
    }
    if (ninputs == 0 || !prefix) {
        free(inputs);
        return usage_error(ninputs == 0 ? "no --input given" : "no --output-prefix given");
    }

    struct mt_err err = {0};
    struct mt_indexed_writer *w = NULL;
    struct mt_preprocess_stats st = {0};
    int rc = mt_indexed_writer_open(prefix, MT_DTYPE_UINT16, &w, &err);
    for (int i = 0; rc == MT_OK && i < ninputs; i++)
        rc = mt_preprocess_file(w, inputs[i], &opts, &st, &err);
    if (rc == MT_OK && st.documents == 0)
        rc = mt_err_set(&err, MT_EINVAL, "the input holds no text: nothing to write");
    if (rc == MT_OK)
        rc = mt_indexed_writer_finish(w, &err);
    else if (w)
        mt_indexed_writer_abort(w);
    free(inputs);
    if (rc != MT_OK) {
        fprintf(stderr, "moetrain-preprocess: error: %s\n", err.msg);
        return 1;
    }
    printf("moetrain-preprocess: wrote %s.bin and %s.idx: %" PRIu64 " documents, %" PRIu64
           " tokens (uint16, vocabulary %d)",
           prefix, prefix, st.documents, st.tokens, MT_BYTE_VOCAB);
    if (st.empty) printf("; %" PRIu64 " empty documents skipped", st.empty);
    printf("\n");
    return 0;
}
