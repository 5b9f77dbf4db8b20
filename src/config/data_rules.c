/* The rules for &data data_path and split: one reading, shared by the configuration
 * check (config.c) and the data loader (src/data/data.c), so that --check accepts
 * exactly what training accepts. Depends on nothing but util, so that the data
 * library can link it alone. */
#include "config/config.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The whole of s is a number strtod reads (it may overflow to inf: the caller says so). */
static bool whole_number(const char *s, double *x)
{
    char *end;
    errno = 0;
    *x = strtod(s, &end);
    return end != s && *end == '\0';
}

#define MAX_WORDS (2 * MT_MAX_DATA_PATHS)

struct words {
    int n;
    char w[MAX_WORDS][MT_STR_MAX];
    int elem[MAX_WORDS];  /* 1-based data_path index the word came from */
};

/* Splits every element at blanks, as Megatron's --data-path reads a shell word list. */
static int split_words(const struct mt_config_data *d, struct words *ws, struct mt_err *err)
{
    ws->n = 0;
    for (int i = 0; i < d->data_path_len; i++) {
        const char *p = d->data_path[i];
        if (p[strspn(p, " \t")] == '\0')
            return mt_err_set(err, MT_EINVAL,
                              "&data data_path(%d) is empty; remove it or name a dataset prefix",
                              i + 1);
        while (*p) {
            p += strspn(p, " \t");
            size_t len = strcspn(p, " \t");
            if (!len) break;
            if (ws->n == MAX_WORDS)
                return mt_err_set(err, MT_EINVAL,
                                  "&data data_path: more than %d datasets (the most moetrain "
                                  "blends)",
                                  MT_MAX_DATA_PATHS);
            memcpy(ws->w[ws->n], p, len);
            ws->w[ws->n][len] = '\0';
            ws->elem[ws->n++] = i + 1;
            p += len;
        }
    }
    return MT_OK;
}

static int check_weight(const struct words *ws, int i, double w, struct mt_err *err)
{
    const char *why = NULL;
    if (!isfinite(w))
        why = "is not a finite number (it overflows a double); weights only set ratios, use "
              "numbers such as 0.3 and 0.7";
    else if (w < 0)
        why = "is negative";
    else if (w == 0)
        why = "is 0: remove the dataset instead (Megatron does not check this, but its "
              "blending can still draw from a zero-weight dataset on a tie, so moetrain "
              "refuses it)";
    if (!why) return MT_OK;
    return mt_err_set(err, MT_EINVAL,
                      "&data data_path(%d) = '%s': the weight of dataset '%s' %s; weights "
                      "must be positive",
                      ws->elem[i], ws->w[i], ws->w[i + 1], why);
}

static int weigh(const struct words *ws, struct mt_data_blend *b, struct mt_err *err)
{
    double sum = 0;
    for (int i = 0; i < ws->n; i += 2) {
        double w;
        whole_number(ws->w[i], &w);
        MT_CHECK(check_weight(ws, i, w, err));
        b->weight[i / 2] = w;
        sum += w;
    }
    if (!isfinite(sum))
        return mt_err_set(err, MT_EINVAL,
                          "&data data_path: the blend weights sum to more than the largest "
                          "number (%g); weights only set ratios, scale them down (e.g. 0.3 "
                          "and 0.7)",
                          DBL_MAX);
    for (int k = 0; k < b->n; k++) {
        b->weight[k] /= sum;
        if (b->weight[k] == 0)
            return mt_err_set(err, MT_EINVAL,
                              "&data data_path(%d) = '%s': the weight of dataset '%s' is too "
                              "small beside the others (%g in all) to be a share",
                              ws->elem[2 * k], ws->w[2 * k], ws->w[2 * k + 1], sum);
    }
    return MT_OK;
}

static int read_blend(const struct words *ws, struct mt_data_blend *b, struct mt_err *err)
{
    b->n = 0;
    b->weighted = false;
    if (ws->n == 0)
        return mt_err_set(err, MT_EINVAL,
                          "&data data_path is empty: name a dataset prefix (e.g. data_path = "
                          "'corpus/kjv_text_document') or set mock_data = .true.");
    int numbers = 0, first_number = -1, first_word = -1;
    for (int i = 0; i < ws->n; i += 2) {
        double x;
        if (whole_number(ws->w[i], &x)) {
            numbers++;
            if (first_number < 0) first_number = i;
        } else if (first_word < 0) {
            first_word = i;
        }
    }
    if (ws->n % 2 == 0 && numbers == ws->n / 2) {
        b->weighted = true;
    } else if (ws->n % 2 == 0 && numbers > 0) {
        return mt_err_set(err, MT_EINVAL,
                          "&data data_path mixes weights and prefixes: data_path(%d) = '%s' is "
                          "a weight but data_path(%d) = '%s' is not; give prefixes only ('p1', "
                          "'p2') or weight/prefix pairs ('0.3', 'p1', '0.7', 'p2')",
                          ws->elem[first_number], ws->w[first_number], ws->elem[first_word],
                          ws->w[first_word]);
    } else {
        for (int i = 0; i < ws->n; i++) {
            double x;
            if (ws->n > 1 && whole_number(ws->w[i], &x))
                return mt_err_set(err, MT_EINVAL,
                                  "&data data_path(%d) = '%s' looks like a weight, but the list "
                                  "has %d words, not weight/prefix pairs; give prefixes only "
                                  "('p1', 'p2') or pairs ('0.3', 'p1', '0.7', 'p2')",
                                  ws->elem[i], ws->w[i], ws->n);
        }
    }
    int step = b->weighted ? 2 : 1;
    if (ws->n / step > MT_MAX_DATA_PATHS)
        return mt_err_set(err, MT_EINVAL,
                          "&data data_path: %d datasets, more than the %d moetrain blends",
                          ws->n / step, MT_MAX_DATA_PATHS);
    for (int i = step - 1; i < ws->n; i += step) {
        memcpy(b->prefix[b->n], ws->w[i], sizeof b->prefix[0]);
        b->weight[b->n++] = 0;
    }
    return b->weighted ? weigh(ws, b, err) : MT_OK;
}

int mt_config_data_blend(const struct mt_config_data *d, struct mt_data_blend *out,
                         struct mt_err *err)
{
    struct words *ws = malloc(sizeof *ws);
    if (!ws)
        return mt_err_set(err, MT_ENOMEM, "out of memory reading &data data_path (%zu bytes)",
                          sizeof *ws);
    int rc = split_words(d, ws, err);
    if (rc == MT_OK) rc = read_blend(ws, out, err);
    free(ws);
    return rc;
}

int mt_config_data_split(const char *split, double vec[3], struct mt_err *err)
{
    static const char seps[] = ",/ \t";
    static const char *const names[3] = {"train", "valid", "test"};
    int n = 0;
    double sum = 0;
    vec[0] = vec[1] = vec[2] = 0;
    for (const char *p = split + strspn(split, seps); *p; p += strspn(p, seps)) {
        size_t len = strcspn(p, seps);
        char tok[64];
        snprintf(tok, sizeof tok, "%.*s", (int)len, p);
        p += len;
        if (n == 3)
            return mt_err_set(err, MT_EINVAL,
                              "&data split = '%s' has more than three values (train, valid, "
                              "test), e.g. '969,30,1'",
                              split);
        double v;
        const char *why = NULL;
        if (!whole_number(tok, &v))
            why = "is not a number";
        else if (!isfinite(v))
            why = "is not a finite number (it overflows a double); the values only set "
                  "ratios";
        else if (v < 0)
            why = "is negative";
        if (why)
            return mt_err_set(err, MT_EINVAL,
                              "&data split = '%s': the %s value '%s' %s; give up to three "
                              "non-negative numbers for train,valid,test, e.g. '969,30,1'",
                              split, names[n], tok, why);
        vec[n++] = v;
        sum += v;
    }
    if (!isfinite(sum))
        return mt_err_set(err, MT_EINVAL,
                          "&data split = '%s': the values sum to more than the largest number "
                          "(%g); they only set ratios, scale them down (e.g. '969,30,1')",
                          split, DBL_MAX);
    if (!(sum > 0))
        return mt_err_set(err, MT_EINVAL,
                          "&data split = '%s': the values must not all be zero, e.g. '969,30,1'",
                          split);
    for (int i = 0; i < n; i++) vec[i] /= sum;
    return MT_OK;
}
