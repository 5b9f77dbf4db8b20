TESTS += tests/train/train_small.sh tests/train/resume_exact.sh tests/train/bad_inputs.sh \
	tests/train/guard.sh tests/train/checkpoint_safety.sh tests/train/signal.sh \
	tests/train/kill9.sh tests/train/ckpt_convert.sh tests/train/async_save.sh \
	tests/train/plan.sh tests/train/fake_world.sh tests/train/hf_transformers.sh tests/train/hf_errors.sh \
	tests/train/host_overhead.sh tests/train/host_syncs.sh tests/train/fp8.sh tests/train/fp8_recipes.sh \
	tests/train/fp8_recipes_wide.sh tests/train/fp8_padding.sh
EXTRA_DIST += tests/train/common.sh tests/train/same_sample.sh tests/train/hf_oracle.py \
	tests/train/hf_transformers.sh tests/train/hf_errors.sh tests/train/same_ckpt.sh tests/train/train_small.sh tests/train/resume_exact.sh \
	tests/train/bad_inputs.sh tests/train/guard.sh tests/train/checkpoint_safety.sh \
	tests/train/signal.sh tests/train/kill9.sh tests/train/ckpt_convert.sh \
	tests/train/async_save.sh tests/fixtures/train/small.nml tests/train/plan.sh \
	tests/train/fake_world.sh tests/fixtures/plan/gb200_4x64.nodes tests/train/host_overhead.sh \
	tests/train/host_syncs.sh tests/train/fp8.sh tests/train/fp8_recipes.sh tests/train/fp8_padding.sh \
	tests/train/fp8_recipes_wide.sh tests/fixtures/train/fp8_wide.nml
tests/train/host_overhead.log: $(MT_ALLOCCOUNT)
