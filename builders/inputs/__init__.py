"""inputs: what a build takes in besides the project: sources and their companions, toolchain inputs, host facts, patches."""
