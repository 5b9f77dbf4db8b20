/* The CPU backend's compute ops, as one x86-64 level's build names them (cpu_isa.h):
 * cpu_backend.c fills its op table from the level it picks. */
#include "kernels/cpu/cpu_ops.h"

void mt_cpu_fill_ops(struct mt_kernel_ops *o)
{
    o->gemm = mt_cpu_t_gemm;
    o->grouped_gemm = mt_cpu_t_grouped_gemm;
    o->embedding_fwd = mt_cpu_t_embedding_fwd;
    o->embedding_bwd = mt_cpu_embedding_bwd;
    o->rmsnorm_fwd = mt_cpu_t_rmsnorm_fwd;
    o->rmsnorm_bwd = mt_cpu_t_rmsnorm_bwd;
    o->rope_fwd = mt_cpu_t_rope_fwd;
    o->rope_bwd = mt_cpu_rope_bwd;
    o->attention_fwd = mt_cpu_t_attention_fwd;
    o->attention_bwd = mt_cpu_t_attention_bwd;
    o->swiglu_fwd = mt_cpu_t_swiglu_fwd;
    o->swiglu_bwd = mt_cpu_t_swiglu_bwd;
    o->add = mt_cpu_t_add;
    o->router_fwd = mt_cpu_router_fwd;
    o->router_bwd = mt_cpu_router_bwd;
    o->aux_counts = mt_cpu_aux_counts;
    o->aux_loss_fwd = mt_cpu_aux_loss_fwd;
    o->aux_loss_bwd = mt_cpu_aux_loss_bwd;
    o->z_loss_fwd = mt_cpu_z_loss_fwd;
    o->z_loss_bwd = mt_cpu_z_loss_bwd;
    o->dispatch_plan = mt_cpu_dispatch_plan;
    o->drop_mask = mt_cpu_drop_mask;
    o->expert_select = mt_cpu_expert_select;
    o->expert_bias_update = mt_cpu_expert_bias_update;
    o->permute_fwd = mt_cpu_t_permute_fwd;
    o->permute_bwd = mt_cpu_permute_bwd;
    o->unpermute_fwd = mt_cpu_t_unpermute_fwd;
    o->unpermute_bwd = mt_cpu_t_unpermute_bwd;
    o->cross_entropy_fwd = mt_cpu_cross_entropy_fwd;
    o->cross_entropy_bwd = mt_cpu_cross_entropy_bwd;
    o->lse_combine = mt_cpu_lse_combine;
    o->loss_sum = mt_cpu_loss_sum;
    o->adamw = mt_cpu_adamw;
    o->adamw_dev = mt_cpu_adamw_dev;
    o->bf16_round = mt_cpu_bf16_round;
    o->convert = mt_cpu_t_convert;
    o->scale = mt_cpu_scale;
    o->sumsq = mt_cpu_sumsq;
    o->amax_history = mt_cpu_amax_history;
}
