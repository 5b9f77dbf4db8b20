# Module files (doc/site-install.md): moetrain/VERSION (Tcl) and moetrain/VERSION.lua
# (Lmod) in $(modulefilesdir) (configure --with-modulefiles-dir), loading the site
# modules of --with-module-prereqs. Written at install time, so that they name the
# directories this installation uses, `make install prefix=...` included; Lmod
# takes the .lua of the two, Environment Modules ignores it (no #%Module line).
MT_MODULEFILE_TEMPLATES = modulefiles/moetrain.lua.in modulefiles/moetrain.tcl.in \
	modulefiles/help.txt
EXTRA_DIST += $(MT_MODULEFILE_TEMPLATES)

# mt_modulefile TEMPLATE: the module file on stdout ([@]: configure must not
# substitute these placeholders in the Makefile itself)
mt_modulefile = sed -e 's|[@]VERSION[@]|$(VERSION)|g' \
	-e 's|[@]MODULE_PREREQS[@]|$(MODULE_PREREQS)|g' \
	-e 's|[@]PACKAGE_BUGREPORT[@]|$(PACKAGE_BUGREPORT)|g' \
	-e '/^Report bugs: $$/d' -e 's/^\(Site modules loaded with it:\) $$/\1 none/' \
	-e 's|[@]prefix[@]|$(prefix)|g' -e 's|[@]bindir[@]|$(bindir)|g' -e 's|[@]mandir[@]|$(mandir)|g' \
	-e 's|[@]pkgdatadir[@]|$(pkgdatadir)|g' -e 's|[@]docdir[@]|$(docdir)|g'

if INSTALL_MODULEFILES
install-data-local: $(MT_MODULEFILE_TEMPLATES)
	$(MKDIR_P) '$(DESTDIR)$(modulefilesdir)/moetrain'
	d='$(DESTDIR)$(modulefilesdir)/moetrain'; \
	$(mt_modulefile) $(srcdir)/modulefiles/help.txt > "$$d/.help" && \
	$(mt_modulefile) -e "/^[@]HELP[@]$$/{r $$d/.help" -e 'd;}' \
		$(srcdir)/modulefiles/moetrain.lua.in > "$$d/$(VERSION).lua" && \
	$(mt_modulefile) -e "/^[@]HELP[@]$$/{r $$d/.help" -e 'd;}' \
		$(srcdir)/modulefiles/moetrain.tcl.in > "$$d/$(VERSION)" && \
	rm -f "$$d/.help" && chmod 644 "$$d/$(VERSION).lua" "$$d/$(VERSION)"
uninstall-local:
	rm -f '$(DESTDIR)$(modulefilesdir)/moetrain/$(VERSION).lua' \
		'$(DESTDIR)$(modulefilesdir)/moetrain/$(VERSION)'
	-rmdir '$(DESTDIR)$(modulefilesdir)/moetrain' '$(DESTDIR)$(modulefilesdir)' 2>/dev/null
endif
