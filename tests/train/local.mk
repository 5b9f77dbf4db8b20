TESTS += tests/train/train_small.sh tests/train/resume_exact.sh tests/train/bad_inputs.sh \
	tests/train/guard.sh
EXTRA_DIST += tests/train/common.sh tests/train/train_small.sh tests/train/resume_exact.sh \
	tests/train/bad_inputs.sh tests/train/guard.sh tests/fixtures/train/small.nml
