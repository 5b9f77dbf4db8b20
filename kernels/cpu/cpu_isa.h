/* The CPU kernels per x86-64 level (doc/site-install.md, "The CPU kernels' instruction
 * set"): the compute files (cpu_dense, cpu_layers, cpu_loss, cpu_moe, cpu_typed and the
 * op table's fill, cpu_table) are compiled once with the build's flags and, on x86-64,
 * again with -march=x86-64-v3 and -march=x86-64-v4 (kernels/cpu/local.mk), each time
 * with MT_CPU_ISA_SUFFIX defined (_v3, _v4) so that every global name below gets the
 * level's suffix; cpu_backend.c picks one level's table at start. A global function
 * added to those files must be added here: tests/kernels/cpu_isa_symbols.sh checks
 * that the level builds define no unsuffixed global. */
#ifndef MT_KERNELS_CPU_ISA_H
#define MT_KERNELS_CPU_ISA_H

#ifdef MT_CPU_ISA_SUFFIX
#define MT_CPU_ISA_CAT2(a, b) a##b
#define MT_CPU_ISA_CAT(a, b) MT_CPU_ISA_CAT2(a, b)
#define MT_CPU_ISA_NAME(n) MT_CPU_ISA_CAT(n, MT_CPU_ISA_SUFFIX)
#define mt_cpu_blas_init MT_CPU_ISA_NAME(mt_cpu_blas_init)
#define mt_cpu_gemm MT_CPU_ISA_NAME(mt_cpu_gemm)
#define mt_cpu_gemm_part MT_CPU_ISA_NAME(mt_cpu_gemm_part)
#define mt_cpu_gemm_bf16 MT_CPU_ISA_NAME(mt_cpu_gemm_bf16)
#define mt_cpu_gemm_parts MT_CPU_ISA_NAME(mt_cpu_gemm_parts)
#define mt_cpu_gemm_range MT_CPU_ISA_NAME(mt_cpu_gemm_range)
#define mt_cpu_grouped_gemm MT_CPU_ISA_NAME(mt_cpu_grouped_gemm)
#define mt_cpu_grouped_gemm_thread MT_CPU_ISA_NAME(mt_cpu_grouped_gemm_thread)
#define mt_cpu_attention_bwd MT_CPU_ISA_NAME(mt_cpu_attention_bwd)
#define mt_cpu_attention_fwd MT_CPU_ISA_NAME(mt_cpu_attention_fwd)
#define mt_cpu_embedding_bwd MT_CPU_ISA_NAME(mt_cpu_embedding_bwd)
#define mt_cpu_rope_bwd MT_CPU_ISA_NAME(mt_cpu_rope_bwd)
#define mt_cpu_swiglu_bwd_span MT_CPU_ISA_NAME(mt_cpu_swiglu_bwd_span)
#define mt_cpu_swiglu_fwd_span MT_CPU_ISA_NAME(mt_cpu_swiglu_fwd_span)
#define mt_cpu_t_embedding_fwd MT_CPU_ISA_NAME(mt_cpu_t_embedding_fwd)
#define mt_cpu_t_rmsnorm_bwd MT_CPU_ISA_NAME(mt_cpu_t_rmsnorm_bwd)
#define mt_cpu_t_rmsnorm_fwd MT_CPU_ISA_NAME(mt_cpu_t_rmsnorm_fwd)
#define mt_cpu_t_rope_fwd MT_CPU_ISA_NAME(mt_cpu_t_rope_fwd)
#define mt_cpu_adamw MT_CPU_ISA_NAME(mt_cpu_adamw)
#define mt_cpu_adamw_dev MT_CPU_ISA_NAME(mt_cpu_adamw_dev)
#define mt_cpu_bf16_round MT_CPU_ISA_NAME(mt_cpu_bf16_round)
#define mt_cpu_cross_entropy_bwd MT_CPU_ISA_NAME(mt_cpu_cross_entropy_bwd)
#define mt_cpu_cross_entropy_fwd MT_CPU_ISA_NAME(mt_cpu_cross_entropy_fwd)
#define mt_cpu_loss_sum MT_CPU_ISA_NAME(mt_cpu_loss_sum)
#define mt_cpu_lse_combine MT_CPU_ISA_NAME(mt_cpu_lse_combine)
#define mt_cpu_scale MT_CPU_ISA_NAME(mt_cpu_scale)
#define mt_cpu_sumsq MT_CPU_ISA_NAME(mt_cpu_sumsq)
#define mt_cpu_aux_counts MT_CPU_ISA_NAME(mt_cpu_aux_counts)
#define mt_cpu_aux_loss_bwd MT_CPU_ISA_NAME(mt_cpu_aux_loss_bwd)
#define mt_cpu_aux_loss_fwd MT_CPU_ISA_NAME(mt_cpu_aux_loss_fwd)
#define mt_cpu_dispatch_plan MT_CPU_ISA_NAME(mt_cpu_dispatch_plan)
#define mt_cpu_drop_mask MT_CPU_ISA_NAME(mt_cpu_drop_mask)
#define mt_cpu_expert_bias_update MT_CPU_ISA_NAME(mt_cpu_expert_bias_update)
#define mt_cpu_expert_select MT_CPU_ISA_NAME(mt_cpu_expert_select)
#define mt_cpu_permute_bwd MT_CPU_ISA_NAME(mt_cpu_permute_bwd)
#define mt_cpu_router_bwd MT_CPU_ISA_NAME(mt_cpu_router_bwd)
#define mt_cpu_router_fwd MT_CPU_ISA_NAME(mt_cpu_router_fwd)
#define mt_cpu_t_permute_fwd MT_CPU_ISA_NAME(mt_cpu_t_permute_fwd)
#define mt_cpu_t_unpermute_bwd MT_CPU_ISA_NAME(mt_cpu_t_unpermute_bwd)
#define mt_cpu_t_unpermute_fwd MT_CPU_ISA_NAME(mt_cpu_t_unpermute_fwd)
#define mt_cpu_z_loss_bwd MT_CPU_ISA_NAME(mt_cpu_z_loss_bwd)
#define mt_cpu_z_loss_fwd MT_CPU_ISA_NAME(mt_cpu_z_loss_fwd)
#define mt_cpu_check_dense MT_CPU_ISA_NAME(mt_cpu_check_dense)
#define mt_cpu_scratch MT_CPU_ISA_NAME(mt_cpu_scratch)
#define mt_cpu_scratch_give MT_CPU_ISA_NAME(mt_cpu_scratch_give)
#define mt_cpu_t_add MT_CPU_ISA_NAME(mt_cpu_t_add)
#define mt_cpu_t_attention_bwd MT_CPU_ISA_NAME(mt_cpu_t_attention_bwd)
#define mt_cpu_t_attention_fwd MT_CPU_ISA_NAME(mt_cpu_t_attention_fwd)
#define mt_cpu_t_convert MT_CPU_ISA_NAME(mt_cpu_t_convert)
#define mt_cpu_t_gemm MT_CPU_ISA_NAME(mt_cpu_t_gemm)
#define mt_cpu_t_grouped_gemm MT_CPU_ISA_NAME(mt_cpu_t_grouped_gemm)
#define mt_cpu_t_swiglu_bwd MT_CPU_ISA_NAME(mt_cpu_t_swiglu_bwd)
#define mt_cpu_t_swiglu_fwd MT_CPU_ISA_NAME(mt_cpu_t_swiglu_fwd)
#define mt_cpu_fill_ops MT_CPU_ISA_NAME(mt_cpu_fill_ops)
#endif

#endif
