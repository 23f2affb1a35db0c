package policy

import "strings"

// steers reports whether a line may not set variable name: it steers the
// shell (steersShell), holds options for a program that can make it run
// another (optionsVariable), or, under an allow list, names a program or
// flags that a build tool runs (toolVariable). Under deny rules alone
// the last are left alone: setting CC for make is everyday work, and
// deny rules cannot foresee what a build runs anyway.
func (c *checker) steers(name string) bool {
	return steersShell(name) || optionsVariable(name) || c.allowList() && toolVariable(name)
}

// optionsVariable reports whether variable name holds options or a
// configuration file for a program, through which it can be made to run
// another: less's key bindings, man's options, zip's options, rsync's
// connection program, ripgrep's configuration, gpg's home (whose gpg.conf
// names the agent and dirmngr programs gpg starts when git signs or
// verifies: git log --show-signature), vim's start-up commands and
// runtime files.
func optionsVariable(name string) bool {
	switch name {
	case "LESSKEY", "LESSKEYIN", "LESSKEY_CONTENT", "LESSKEY_SYSTEM", "LESSKEYIN_SYSTEM", "LESSEDIT",
		"LESSGLOBALTAGS", "MANOPT", "MANROFFOPT", "ZIPOPT", "ZIP", "UNZIP", "UNZIPOPT", "RSYNC_CONNECT_PROG",
		"RIPGREP_CONFIG_PATH", "SYSTEMD_LESS", "SYSTEMD_PAGERSECURE", "WGETRC", "PERL5DB", "PERLDB_OPTS", "PYTHONSTARTUP",
		"PYTHONINSPECT", "GNUPGHOME", "VIMINIT", "GVIMINIT", "EXINIT", "MYVIMRC", "VIMRUNTIME", "VIM", "SCREENRC",
		"CURL_HOME", "IRBRC", "INPUTRC", "EMACSLOADPATH", "MORE", "MANROFFSEQ", "DOCKER_CONFIG", "KUBECONFIG", "APT_CONFIG",
		"PERF_CONFIG", "PERF_EXEC_PATH", "PERF_PAGER", "MAILCAPS", "RSYNC_PROXY":
		return true
	}
	return false
}

// toolVariable reports whether variable name names a program, or flags
// or configuration that can name one, for a compiler or build tool: CC
// and CFLAGS (gcc -wrapper), GOFLAGS (-toolexec), GOCACHEPROG, RUSTC_WRAPPER,
// cargo's and npm's configuration, make's flags and the programs of its
// built-in rules, the compilers and generators build scripts run
// (TARGET_CC, CC_<target>, PROTOC, CMAKE), the module paths interpreters
// load code from.
func toolVariable(name string) bool {
	switch name {
	case "CC", "CXX", "CPP", "FC", "F77", "F90", "AR", "AS", "LD", "NM", "RANLIB", "STRIP", "OBJCOPY", "OBJDUMP",
		"PKG_CONFIG", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "LDLIBS", "FFLAGS", "MAKE", "MAKEFLAGS",
		"MFLAGS", "GNUMAKEFLAGS", "MAKEFILES", "MAKESHELL",
		// The programs of make's built-in rules: "make dir/x.log GET=sh"
		// runs "sh dir/s.x.log", a file of the caller's (SCCS's rule).
		"GET", "CO", "LEX", "YACC", "LINT", "M2C", "PC", "OBJC", "TEX", "TEXI2DVI", "MAKEINFO", "WEAVE",
		"CWEAVE", "TANGLE", "CTANGLE", "RM",
		// GOCACHEPROG and GOAUTH name programs every build (or fetch)
		// runs; a GOWORK file replaces the project's modules and toolchain.
		"GOFLAGS", "GOENV", "GOTOOLCHAIN", "GOROOT", "GCCGO", "GOGCCFLAGS", "GOPROXY", "GOSUMDB", "GONOSUMDB",
		"GONOSUMCHECK", "GOINSECURE", "GOCACHEPROG", "GOAUTH", "GOWORK",
		"RUSTC", "RUSTC_WRAPPER", "RUSTC_WORKSPACE_WRAPPER", "RUSTDOC", "RUSTFLAGS", "RUSTDOCFLAGS",
		"RUSTUP_TOOLCHAIN", "RUSTUP_HOME",
		// What build scripts run: the cc crate's compilers, cmake,
		// protoc, the Python of PyO3, bindgen's clang.
		"CROSS_COMPILE", "TARGET_CC", "HOST_CC", "TARGET_CXX", "HOST_CXX", "TARGET_AR", "HOST_AR",
		"TARGET_CFLAGS", "HOST_CFLAGS", "TARGET_CXXFLAGS", "HOST_CXXFLAGS", "CMAKE", "PROTOC", "PYO3_PYTHON",
		"LIBCLANG_PATH", "CLANG_PATH",
		"PYTHONPATH", "PYTHONHOME", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PERL5LIB", "PERLLIB", "RUBYLIB",
		"NODE_PATH",
		// Where interpreters find code they load by themselves: python's
		// user site directory (its .pth files run), its compiled-code
		// cache, coverage's and pytest-cov's configuration (plugins),
		// java's class path, lua's, php's, R's and julia's start-up files
		// and module paths, ruby's gems.
		"PYTHONUSERBASE", "PYTHONPYCACHEPREFIX", "PYTHONEXECUTABLE", "PYTHONPLATLIBDIR", "COVERAGE_PROCESS_START",
		"COVERAGE_RCFILE", "COV_CORE_SOURCE", "COV_CORE_CONFIG", "COV_CORE_DATAFILE", "CLASSPATH", "LUA_PATH",
		"LUA_CPATH", "PHPRC", "PHP_INI_SCAN_DIR", "R_PROFILE", "R_PROFILE_USER", "R_ENVIRON", "R_ENVIRON_USER",
		"R_LIBS", "R_LIBS_USER", "JULIA_LOAD_PATH", "JULIA_DEPOT_PATH", "JULIA_PROJECT", "GEM_HOME", "GEM_PATH",
		"BUNDLE_GEMFILE", "RUBYGEMS_GEMDEPS", "TCLLIBPATH", "PERL_MB_OPT", "PERL_MM_OPT", "COMPILER_PATH",
		"GCC_EXEC_PREFIX", "CPATH", "LIBRARY_PATH", "QT_PLUGIN_PATH":
		return true
	}
	if prog, _, ok := strings.Cut(name, "."); ok {
		// Make's built-in recipes start with these: COMPILE.c, LINK.o.
		switch prog {
		case "COMPILE", "LINK", "PREPROCESS", "LEX", "YACC", "LINT":
			return true
		}
	}
	for _, prefix := range []string{"CC_", "CXX_", "AR_", "CFLAGS_", "CXXFLAGS_", "RANLIB_"} {
		// The cc crate's per-target compilers: CC_x86_64_unknown_linux_gnu.
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	switch {
	case strings.HasPrefix(name, "CGO_"):
		return name != "CGO_ENABLED"
	case strings.HasPrefix(name, "CARGO_"):
		// Cargo reads its whole configuration from CARGO_* (runners,
		// linkers, wrappers, aliases, credential providers).
		return !strings.HasPrefix(name, "CARGO_TERM_") && !strings.HasPrefix(name, "CARGO_PROFILE_") &&
			name != "CARGO_TARGET_DIR" && name != "CARGO_INCREMENTAL" && name != "CARGO_BUILD_JOBS"
	case strings.HasPrefix(strings.ToLower(name), "npm_config_"):
		return true // npm's configuration: script-shell, node-options, git, ...
	case strings.HasPrefix(name, "YARN_"), strings.HasPrefix(name, "PNPM_"), strings.HasPrefix(name, "BUNDLE_"):
		return true // yarn's (yarnPath runs a file), pnpm's and bundler's configuration
	}
	return false
}
