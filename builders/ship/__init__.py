"""ship: what a build hands out: the stage and its gate, packages, the bundle, its manifest, installs."""
