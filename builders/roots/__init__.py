"""roots: where a command runs: the host as the trivial root, pinned Debian build roots, the sandbox, the sysroot."""
