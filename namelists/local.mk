# Shipped configurations, installed under $(pkgdatadir)/namelists.
nobase_dist_pkgdata_DATA += namelists/tiny_moe.nml namelists/qwen3_30b_a3b.nml \
	namelists/qwen3_235b_a22b.nml namelists/mixtral_8x7b.nml
