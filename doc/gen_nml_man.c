/* Writes moetrain.nml(5) from the schema table, so the manual and the parser
 * can never disagree about a key. */
#include <stdio.h>
#include <string.h>

#include "config.h"
#include "config/schema.h"

static void roff_escape(const char *s)
{
    for (; *s; s++) {
        if (*s == '\\') fputs("\\e", stdout);
        else if (*s == '-') fputs("\\-", stdout);
        else putchar(*s);
    }
}

int main(void)
{
    printf(".TH MOETRAIN.NML 5 \"\" \"%s\" \"File Formats\"\n", PACKAGE_STRING);
    puts(".SH NAME\nmoetrain.nml \\- configuration files of moetrain(1)");
    puts(".SH DESCRIPTION\n"
         "moetrain is configured by standard Fortran namelist files: groups \\fB&name\\fR ... "
         "\\fB/\\fR (also \\fB&end\\fR and \\fB$name\\fR ... \\fB$end\\fR), case-insensitive "
         "names, \\fB!\\fR comments, repeat counts (\\fB4*1\\fR), null values (which keep the "
         "default), array sections (\\fBlayer_freq(2:8:2) = 4*0\\fR), strings in single or "
         "double quotes with doubled-quote escapes, logicals (\\fB.true.\\fR, \\fBT\\fR, "
         "\\fB.f.\\fR), and reals with \\fBe\\fR or \\fBd\\fR exponents. Several files may be "
         "given; later files, and then \\fIgroup\\fB%\\fIkey\\fB=\\fIvalue\\fR command-line "
         "overrides, win. A group may appear more than once; the later assignment wins.\n"
         ".PP\n"
         "Group and key names follow Megatron-Core's command-line flags with \\fB_\\fR for "
         "\\fB\\-\\fR, scoped by group. A default of 0 described as derived is resolved from "
         "other keys; \\fBmoetrain \\-\\-print\\-config\\fR shows every resolved value. "
         "Sizes derived from several keys (such as 4 x hidden_size, num_attention_heads x "
         "kv_channels, micro_batch_size x seq_length x router_topk, micro_batch_size x the "
         "data-parallel size) are checked in 64 bits and must not exceed 2147483647; "
         "\\fBmoetrain \\-\\-check\\fR names the keys of one that does.");
    puts(".SH KEYS");
    const char *group = "";
    for (const struct mt_key *k = mt_schema; k->name; k++) {
        if (strcmp(group, k->group)) {
            group = k->group;
            printf(".SS &%s\n", group);
        }
        printf(".TP\n\\fB%s\\fR (%s, default ", k->name, mt_key_type_name(k->type));
        switch (k->type) {
        case MT_KEY_INT: printf("%lld", k->idef); break;
        case MT_KEY_REAL: printf("%g", k->rdef); break;
        case MT_KEY_BOOL: printf("%s", k->idef ? ".true." : ".false."); break;
        case MT_KEY_INT_ARRAY: printf("empty"); break;
        default: printf("'"); roff_escape(k->sdef ? k->sdef : ""); printf("'"); break;
        }
        printf(")\n");
        roff_escape(k->doc);
        if (k->choices) {
            printf(". One of: ");
            roff_escape(k->choices);
        }
        printf(".\n");
    }
    puts(".SH EXAMPLE\n.nf\n&model\n  num_layers = 2, hidden_size = 128\n  num_attention_heads "
         "= 4, num_query_groups = 2\n/\n&moe num_experts = 4, router_topk = 2, layer_freq = "
         "2*1 /\n.fi");
    puts(".SH SEE ALSO\nmoetrain(1), moetrain\\-preprocess(1)");
    return 0;
}
