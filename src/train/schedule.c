#include <math.h>
#include <string.h>

#include "train/train.h"

double mt_lr_at(const struct mt_config_optimizer *o, long long steps_done)
{
    const double warm = o->lr_warmup_iters, decay = o->lr_decay_iters;
    const double s = (double)steps_done;
    if (o->lr_warmup_iters > 0 && s <= warm) return o->lr * s / warm;
    if (strcmp(o->lr_decay_style, "constant") == 0) return o->lr;
    if (s > decay) return o->min_lr;
    double ratio = (s - warm) / (decay - warm);
    double coeff;
    if (strcmp(o->lr_decay_style, "linear") == 0)
        coeff = 1.0 - ratio;
    else /* cosine */
        coeff = 0.5 * (cos(M_PI * ratio) + 1.0);
    return o->min_lr + coeff * (o->lr - o->min_lr);
}
