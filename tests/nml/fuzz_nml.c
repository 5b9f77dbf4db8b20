/* moetrain: libFuzzer target for the namelist parser.  Any input must parse or
 * fail with one message, without a crash, leak or sanitizer report. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "nml/nml.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct mt_nml_file *f = NULL;
    struct mt_err err;
    if (mt_nml_parse_string("fuzz.nml", (const char *)data, size, &f, &err) != MT_OK) {
        /* An error names the input and points into it. */
        if (strncmp(err.msg, "fuzz.nml:", 9) != 0) __builtin_trap();
        return 0;
    }
    /* Format an error at each value, as the config module does. */
    for (size_t g = 0; g < f->ngroups; g++)
        for (size_t a = 0; a < f->groups[g].nassign; a++) {
            const struct mt_nml_assign *as = &f->groups[g].assigns[a];
            for (size_t v = 0; v < as->nvalues && v < 4; v++)
                mt_nml_error_at(f, as->values[v].line, as->values[v].col, &err, MT_EINVAL, "bad %s",
                                as->name);
        }
    mt_nml_free(f);
    return 0;
}
